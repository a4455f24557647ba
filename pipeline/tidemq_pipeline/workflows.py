"""Pure DataFrame transforms of the report's workflow figures: what became of each workflow.

A workflow is the messages of one submission with dependencies: the rows whose ``workflow_id``
names the id of its first step, from that id up (a message stored before that a step waited
on carries the workflow's id too, with a lower id of its own, and is not one of its steps; the
console counts the same way). Its state is derived from its steps' statuses as the console
derives it: running while a step is NEW, WAITING or RUNNING; else failed when a step is FAIL,
cancelled when one is CANCELLED, succeeded when all succeeded. It started when its first step
was added and ended (unless running) when its last step finished.
"""

from __future__ import annotations

from datetime import datetime
from typing import Optional

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tidemq.lifecycle import MessageStatus
from tidemq.tables import MESSAGE as M

from .frames import has_status

__all__ = ["WORKFLOW_STATES", "workflow_outcomes", "window_figures"]

RUNNING, SUCCEEDED, FAILED, CANCELLED = "running", "succeeded", "failed", "cancelled"
WORKFLOW_STATES = (RUNNING, SUCCEEDED, FAILED, CANCELLED)
_UNFINISHED = (MessageStatus.NEW, MessageStatus.WAITING, MessageStatus.RUNNING)


def _any(statuses) -> F.Column:
    return F.max(F.when(has_status(statuses), 1).otherwise(0)) == 1


def workflow_outcomes(messages: DataFrame) -> DataFrame:
    """One row per workflow: ``workflow_id``, ``steps``, ``state``, ``started`` and ``ended``
    (NULL while running)."""
    steps = messages.where(F.col(M.workflow_id).isNotNull() & (F.col(M.id) >= F.col(M.workflow_id)))
    grouped = steps.groupBy(M.workflow_id).agg(
        F.count(F.lit(1)).alias("steps"), F.min(M.add_time).alias("started"),
        F.max(F.coalesce(F.col(M.finish_time), F.col(M.update_time))).alias("last_end"),
        _any(_UNFINISHED).alias("unfinished"), _any([MessageStatus.FAIL]).alias("failed"),
        _any([MessageStatus.CANCELLED]).alias("cancelled"))
    state = (F.when(F.col("unfinished"), F.lit(RUNNING)).when(F.col("failed"), F.lit(FAILED))
             .when(F.col("cancelled"), F.lit(CANCELLED)).otherwise(F.lit(SUCCEEDED)))
    return grouped.select(M.workflow_id, "steps", state.alias("state"), "started",
                          F.when(F.col("unfinished"), F.lit(None)).otherwise(F.col("last_end")).alias("ended"))


def window_figures(outcomes: DataFrame, since: Optional[datetime] = None) -> dict[str, int]:
    """The workflows started from ``since`` on (all when None), those that ended from then on
    by their state, and those running now: ``{"started": n, "succeeded": n, "failed": n,
    "cancelled": n, "running": n}``."""
    start = F.lit(True) if since is None else F.col("started") >= F.lit(since)
    end = F.col("ended").isNotNull() if since is None else F.col("ended") >= F.lit(since)
    row = outcomes.agg(
        F.sum(F.when(start, 1).otherwise(0)).alias("started"),
        *[F.sum(F.when(end & (F.col("state") == state), 1).otherwise(0)).alias(state)
          for state in (SUCCEEDED, FAILED, CANCELLED)],
        F.sum(F.when(F.col("state") == RUNNING, 1).otherwise(0)).alias(RUNNING)).collect()[0]
    return {name: int(row[name] or 0) for name in ("started", SUCCEEDED, FAILED, CANCELLED, RUNNING)}
