"""Pure DataFrame transforms of the alarm job: per-topic health figures and the alarms they raise.

Kinds of alarm (value > threshold raises it):
- backlog: messages due (the later of add_time and order_time is past) and not finished,
  against tidemq_topic.alarm_backlog.
- failure_rate: FAIL / (SUCCESS + FAIL) among messages finished in the last window, against
  alarm_failure_rate (a fraction, 0.1 = 10 %).
- lease_overrun: messages still RUNNING more than a grace period past their lease (lease expiry
  is not keeping up, or no broker is leader); every topic, threshold 0.
- due_age: seconds since the oldest NEW message became due (effect_time), against alarm_due_age.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

__all__ = ["KINDS", "health", "raised"]

KINDS = ("backlog", "failure_rate", "lease_overrun", "due_age")


def health(messages: DataFrame, now: datetime, window: float, lease_grace: float) -> DataFrame:
    """One row per topic: backlog, finished and failed in the window, overrun leases, oldest due age (s)."""
    since = now - timedelta(seconds=window)
    overrun = now - timedelta(seconds=lease_grace)
    pending = F.col("status").isin("NEW", "RUNNING")
    finished_recently = F.col("status").isin("SUCCESS", "FAIL") & (F.col("finish_time") >= F.lit(since))
    due_new = (F.col("status") == "NEW") & (F.col("effect_time") <= F.lit(now))
    return messages.groupBy("topic").agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(pending & (F.greatest("add_time", "order_time") <= F.lit(now)), 1).otherwise(0)).alias("backlog"),
        F.sum(F.when(finished_recently, 1).otherwise(0)).alias("finished"),
        F.sum(F.when(finished_recently & (F.col("status") == "FAIL"), 1).otherwise(0)).alias("failed"),
        F.sum(F.when((F.col("status") == "RUNNING") & (F.col("lease_expire") < F.lit(overrun)), 1).otherwise(0))
        .alias("lease_overrun"),
        F.min(F.when(due_new, F.col("effect_time"))).alias("oldest_due"),
    ).withColumn(
        "due_age", F.coalesce((F.unix_micros(F.lit(now)) - F.unix_micros("oldest_due")) / F.lit(1e6), F.lit(0.0))
    ).drop("oldest_due")


def raised(figures: DataFrame, topics: DataFrame) -> DataFrame:
    """(topic, kind, value, threshold) for every figure above its topic's threshold.

    ``topics`` has name, alarm_backlog, alarm_failure_rate, alarm_due_age (NULL: no alarm)."""
    joined = figures.join(topics.withColumnRenamed("name", "topic"), "topic", "left")
    rate = F.when(F.col("finished") > 0, F.col("failed") / F.col("finished")).otherwise(F.lit(0.0))
    checks = [
        ("backlog", F.col("backlog").cast("double"), F.col("alarm_backlog").cast("double")),
        ("failure_rate", rate, F.col("alarm_failure_rate").cast("double")),
        ("lease_overrun", F.col("lease_overrun").cast("double"), F.lit(0.0)),
        ("due_age", F.col("due_age").cast("double"), F.col("alarm_due_age").cast("double")),
    ]
    parts = [joined.select("topic", F.lit(kind).alias("kind"), value.alias("value"), threshold.alias("threshold"))
             for kind, value, threshold in checks]
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    return union.where(F.col("threshold").isNotNull() & (F.col("value") > F.col("threshold")))
