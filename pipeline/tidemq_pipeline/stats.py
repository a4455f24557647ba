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

__all__ = ["STAT_COLUMNS", "hourly_stats", "trace_events"]

STAT_COLUMNS = ("topic", "hour", "produced", "succeeded", "failed", "retried", "lease_expired", "backlog",
                "lateness_p50_ms", "lateness_p95_ms", "lateness_p99_ms",
                "duration_p50_ms", "duration_p95_ms", "duration_p99_ms")
_COUNTS = ("produced", "succeeded", "failed", "retried", "lease_expired", "due", "done")


def _finished():
    return F.col("status").isin("SUCCESS", "FAIL") & F.col("finish_time").isNotNull()


def _hour(column: str):
    return F.date_trunc("hour", F.col(column)).alias("hour")


def _ms_between(later: str, earlier: str):
    return (F.unix_micros(F.col(later)) - F.unix_micros(F.col(earlier))) / F.lit(1000.0)


def _percentiles(value, prefix: str):
    # Exact, not percentile_approx: an hour of one topic fits in memory, and operators compare
    # these numbers with what they measure themselves.
    return F.percentile(value, F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))).alias(prefix)


def trace_events(messages: DataFrame, events: tuple[str, ...] = ("RETRY", "LEASE_EXPIRED")) -> DataFrame:
    """One row (topic, time, event) per trace line whose event is in ``events``."""
    lines = messages.select("topic", F.explode(F.split(F.col("trace"), "\n")).alias("line"))
    parts = lines.where(F.col("line") != "").select("topic", F.split("line", " ").alias("p"))
    return (parts.select("topic", F.to_timestamp(F.col("p")[0], "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("time"),
                         F.col("p")[1].alias("event"))
            .where(F.col("event").isin(*events) & F.col("time").isNotNull()))


def hourly_stats(messages: DataFrame) -> DataFrame:
    """One row per topic and hour from the first hour a message was added to the last hour
    anything happened, with the columns of tidemq_topic_stats (computed_at aside)."""
    produced = messages.groupBy("topic", _hour("add_time")).agg(F.count(F.lit(1)).alias("produced"))
    finished = messages.where(_finished()).groupBy("topic", _hour("finish_time")).agg(
        F.sum(F.when(F.col("status") == "SUCCESS", 1).otherwise(0)).alias("succeeded"),
        F.sum(F.when(F.col("status") == "FAIL", 1).otherwise(0)).alias("failed"),
        F.count(F.lit(1)).alias("done"),
        _percentiles(_ms_between("finish_time", "start_time"), "duration"))
    started = (messages.where(F.col("status").isin("RUNNING", "SUCCESS", "FAIL") & F.col("start_time").isNotNull())
               .groupBy("topic", _hour("start_time")).agg(_percentiles(_ms_between("start_time", "effect_time"), "lateness")))
    due = (messages.withColumn("due_at", F.greatest("add_time", "order_time"))
           .groupBy("topic", _hour("due_at")).agg(F.count(F.lit(1)).alias("due")))
    events = trace_events(messages).groupBy("topic", _hour("time")).agg(
        F.sum(F.when(F.col("event") == "RETRY", 1).otherwise(0)).alias("retried"),
        F.sum(F.when(F.col("event") == "LEASE_EXPIRED", 1).otherwise(0)).alias("lease_expired"))

    # The hours shown: from the first add to the last thing that happened (a message due years
    # ahead does not stretch the grid; it joins the backlog when its hour comes).
    activity = (produced.select("topic", "hour").unionByName(finished.select("topic", "hour"))
                .unionByName(started.select("topic", "hour")).unionByName(events.select("topic", "hour")))
    grid = (activity.groupBy("topic").agg(F.min("hour").alias("first"), F.max("hour").alias("last"))
            .select("topic", F.explode(F.sequence("first", "last", F.expr("INTERVAL 1 HOUR"))).alias("hour")))

    joined = grid
    for part in (produced, finished, started, due, events):
        joined = joined.join(part, ["topic", "hour"], "left")
    joined = joined.fillna(0, subset=list(_COUNTS))
    running = Window.partitionBy("topic").orderBy("hour").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    joined = joined.withColumn("backlog", F.sum(F.col("due") - F.col("done")).over(running))
    columns = [F.col(c).cast("long").alias(c) for c in ("produced", "succeeded", "failed", "retried", "lease_expired", "backlog")]
    for prefix in ("lateness", "duration"):
        columns += [F.col(prefix)[i].alias(f"{prefix}_{name}_ms") for i, name in enumerate(("p50", "p95", "p99"))]
    return joined.select("topic", "hour", *columns).orderBy("topic", "hour")
