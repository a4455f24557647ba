"""Pure DataFrame transforms of the report: per topic and hour, what happened to its messages.

Definitions (the tests recompute each one in plain Python on the same rows):

- produced: messages added in the hour (add_time).
- succeeded / failed: messages that reached SUCCESS / FAIL in the hour (finish_time).
- retried / lease_expired: RETRY / LEASE_EXPIRED lines of the traces, by the line's time.
- backlog: at the end of the hour, messages already due (the later of add_time and order_time,
  the effect time as produced) and not finished (not SUCCESS/FAIL by then).
- lateness: start_time - effect_time of the attempt that last started, in ms, by start hour.
- duration: finish_time - start_time of finished messages, in ms, by finish hour.
Percentiles are exact (linear interpolation between the closest ranks).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from tidemq.lifecycle import ARCHIVABLE_STATUSES, Event, MessageStatus
from tidemq.tables import MESSAGE as M
from tidemq.tables import TOPIC_STATS as TS

from .frames import has_status

__all__ = ["STAT_COLUMNS", "hourly_stats", "trace_events"]

#: The columns of tidemq_topic_stats the report computes (computed_at is the job's).
STAT_COLUMNS = tuple(name for name in TS.columns() if name != TS.computed_at)
_COUNTS = (TS.produced, TS.succeeded, TS.failed, TS.retried, TS.lease_expired, "due", "done")
_STARTED = (MessageStatus.RUNNING, *ARCHIVABLE_STATUSES)  # a consumer has leased it at least once


def _finished():
    return has_status(ARCHIVABLE_STATUSES) & F.col(M.finish_time).isNotNull()


def _hour(column: str):
    return F.date_trunc("hour", F.col(column)).alias(TS.hour)


def _ms_between(later: str, earlier: str):
    return (F.unix_micros(F.col(later)) - F.unix_micros(F.col(earlier))) / F.lit(1000.0)


def _percentiles(value, prefix: str):
    # Exact, not percentile_approx: an hour of one topic fits in memory, and operators compare
    # these numbers with what they measure themselves.
    return F.percentile(value, F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))).alias(prefix)


def trace_events(messages: DataFrame, events: tuple[Event, ...] = (Event.RETRY, Event.LEASE_EXPIRED)) -> DataFrame:
    """One row (topic, time, event) per trace line whose event is in ``events``."""
    lines = messages.select(M.topic, F.explode(F.split(F.col(M.trace), "\n")).alias("line"))
    parts = lines.where(F.col("line") != "").select(M.topic, F.split("line", " ").alias("p"))
    return (parts.select(M.topic, F.to_timestamp(F.col("p")[0], "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("time"),
                         F.col("p")[1].alias("event"))
            .where(F.col("event").isin(*[e.value for e in events]) & F.col("time").isNotNull()))


def _per_topic_hour(messages: DataFrame, time_column: str) -> DataFrame:
    """``messages`` grouped by topic and the hour of ``time_column`` (named as tidemq_topic_stats)."""
    return messages.groupBy(F.col(M.topic).alias(TS.topic), _hour(time_column))


def _counted(status: MessageStatus, alias: str):
    return F.sum(F.when(has_status([status]), 1).otherwise(0)).alias(alias)


def hourly_stats(messages: DataFrame) -> DataFrame:
    """One row per topic and hour from the first hour a message was added to the last hour
    anything happened, with the columns of tidemq_topic_stats (computed_at aside)."""
    topic, hour = TS.topic, TS.hour
    produced = _per_topic_hour(messages, M.add_time).agg(F.count(F.lit(1)).alias(TS.produced))
    finished = _per_topic_hour(messages.where(_finished()), M.finish_time).agg(
        _counted(MessageStatus.SUCCESS, TS.succeeded), _counted(MessageStatus.FAIL, TS.failed),
        F.count(F.lit(1)).alias("done"),
        _percentiles(_ms_between(M.finish_time, M.start_time), "duration"))
    started = (_per_topic_hour(messages.where(has_status(_STARTED) & F.col(M.start_time).isNotNull()), M.start_time)
               .agg(_percentiles(_ms_between(M.start_time, M.effect_time), "lateness")))
    due = (_per_topic_hour(messages.withColumn("due_at", F.greatest(M.add_time, M.order_time)), "due_at")
           .agg(F.count(F.lit(1)).alias("due")))
    events = _per_topic_hour(trace_events(messages), "time").agg(
        F.sum(F.when(F.col("event") == Event.RETRY.value, 1).otherwise(0)).alias(TS.retried),
        F.sum(F.when(F.col("event") == Event.LEASE_EXPIRED.value, 1).otherwise(0)).alias(TS.lease_expired))

    # The hours shown: from the first add to the last thing that happened (a message due years
    # ahead does not stretch the grid; it joins the backlog when its hour comes).
    activity = (produced.select(topic, hour).unionByName(finished.select(topic, hour))
                .unionByName(started.select(topic, hour)).unionByName(events.select(topic, hour)))
    grid = (activity.groupBy(topic).agg(F.min(hour).alias("first"), F.max(hour).alias("last"))
            .select(topic, F.explode(F.sequence("first", "last", F.expr("INTERVAL 1 HOUR"))).alias(hour)))

    joined = grid
    for part in (produced, finished, started, due, events):
        joined = joined.join(part, [topic, hour], "left")
    joined = joined.fillna(0, subset=list(_COUNTS))
    running = Window.partitionBy(topic).orderBy(hour).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    joined = joined.withColumn(TS.backlog, F.sum(F.col("due") - F.col("done")).over(running))
    counts = (TS.produced, TS.succeeded, TS.failed, TS.retried, TS.lease_expired, TS.backlog)
    columns = [F.col(c).cast("long").alias(c) for c in counts]
    for prefix in ("lateness", "duration"):
        columns += [F.col(prefix)[i].alias(f"{prefix}_{name}_ms") for i, name in enumerate(("p50", "p95", "p99"))]
    return joined.select(topic, hour, *columns).select(*STAT_COLUMNS).orderBy(topic, hour)
