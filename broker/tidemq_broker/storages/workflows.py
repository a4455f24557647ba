"""The workflow row in SQL (``tidemq_workflow``): created by a submission of steps, lowered in
the transaction of each step's end, read by id (cancelling a workflow whole, which walks what
waits on its steps, is in ``dependencies.py``).

See ``workflow_tally.py`` for why exactly one transaction ends a workflow. The decrement is a
transaction's last statement, after every message row it locks, so two transactions never
wait on each other's message rows while one holds a workflow row.
"""

from __future__ import annotations

from datetime import datetime
from typing import Callable, Mapping, Optional, Sequence

from sqlalchemy import BigInteger, Connection, Integer, bindparam, func, insert, select, update

from tidemq.dependencies import WorkflowState
from tidemq.lifecycle import MessageStatus

from ..records import WorkflowRecord
from ..schema import message as m
from ..schema import workflow as w
from .database import SqlDatabase
from .workflow_tally import Tally, final_state

__all__ = ["create_workflow", "settle", "SqlWorkflows"]

_OPEN = (MessageStatus.NEW.value, MessageStatus.WAITING.value, MessageStatus.RUNNING.value)


# settle's statements, built once (they run in every ack of a workflow's steps).
_COUNT_ENDS = update(w).where(w.c.id == bindparam("wid", type_=BigInteger)).values(
    steps_left=w.c.steps_left - bindparam("ended", type_=Integer),
    steps_failed=w.c.steps_failed + bindparam("failed", type_=Integer))
_LIVE_ROW = select(w.c.state, w.c.steps_left, w.c.steps_failed) \
    .where(w.c.id == bindparam("wid", type_=BigInteger), w.c.finished_at.is_(None)).with_for_update()

def create_workflow(conn: Connection, workflow_id: int, policy: str, total: int, stopped: int, failed: int,
                    now: datetime) -> dict[int, str]:
    """The row of a new workflow of ``total`` steps, ``stopped`` of them ended at once (``failed``
    of those FAIL or CANCELLED); {id: state} if that ended it."""
    conn.execute(insert(w).values(id=workflow_id, policy=policy, state=WorkflowState.RUNNING.value,
                                  steps_total=total, steps_left=total, steps_failed=0, created_at=now))
    tally = Tally()
    if stopped:
        tally.add(workflow_id, stopped, failed)
    return settle(conn, tally, now)


def settle(conn: Connection, tally: Tally, now: datetime) -> dict[int, str]:
    """Lower ``steps_left`` (and raise ``steps_failed``) of each workflow in ``tally``, ascending
    ids (one lock order); end those with no step left. Returns {id: state} of the workflows this
    transaction ended. A workflow without a row (submitted before schema version 13) is skipped."""
    finished: dict[int, str] = {}
    for workflow_id in sorted(tally.counts):
        ended, failed = tally.counts[workflow_id]
        if not conn.execute(_COUNT_ENDS, {"wid": workflow_id, "ended": ended, "failed": failed}).rowcount:
            continue
        if workflow_id in tally.open:  # a step released here is left: it cannot have ended
            continue
        row = conn.execute(_LIVE_ROW, {"wid": workflow_id}).first()
        if row is not None and row.steps_left <= 0:
            state = final_state(row.state, row.steps_failed)
            conn.execute(update(w).where(w.c.id == workflow_id, w.c.finished_at.is_(None))
                         .values(state=state, finished_at=now))
            finished[workflow_id] = state
    return finished


class SqlWorkflows:
    """Reading a workflow's row and the topics of its messages; the listeners of its ends."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def workflow(self, workflow_id: int) -> Optional[WorkflowRecord]:
        row = self._db.tx(lambda conn: conn.execute(select(w).where(w.c.id == workflow_id)).first())
        return WorkflowRecord(**row._mapping) if row is not None else None

    def workflow_open_step(self, workflow_id: int) -> Optional[int]:
        return self._db.tx(lambda conn: conn.execute(
            select(func.max(m.c.id)).where(m.c.workflow_id == workflow_id, m.c.status.in_(_OPEN))).scalar())

    def workflow_topics(self, workflow_ids: Sequence[int]) -> set[str]:
        wanted = sorted(set(workflow_ids))
        if not wanted:
            return set()
        return set(self._db.tx(lambda conn: conn.execute(
            select(m.c.topic).where(m.c.workflow_id.in_(wanted)).distinct()).scalars()))

    def watch_workflows(self, listener: Callable[[Mapping[str, int]], None]) -> None:
        self._db.workflow_outcomes.watch(listener)
