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

from tidemq.lifecycle import ARCHIVABLE_STATUSES, MessageStatus
from tidemq.tables import MESSAGE as M
from tidemq.tables import TOPIC

from .frames import has_status

__all__ = ["KINDS", "PENDING_STATUSES", "health", "raised"]

KINDS = ("backlog", "failure_rate", "lease_overrun", "due_age")
#: Not finished yet: what the backlog counts.
PENDING_STATUSES = (MessageStatus.NEW, MessageStatus.RUNNING)


def health(messages: DataFrame, now: datetime, window: float, lease_grace: float) -> DataFrame:
    """One row per topic: backlog, finished and failed in the window, overrun leases, oldest due age (s)."""
    since = now - timedelta(seconds=window)
    overrun = now - timedelta(seconds=lease_grace)
    pending = has_status(PENDING_STATUSES)
    finished_recently = has_status(ARCHIVABLE_STATUSES) & (F.col(M.finish_time) >= F.lit(since))
    due_new = has_status([MessageStatus.NEW]) & (F.col(M.effect_time) <= F.lit(now))
    overrun_lease = has_status([MessageStatus.RUNNING]) & (F.col(M.lease_expire) < F.lit(overrun))
    return messages.groupBy(M.topic).agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(pending & (F.greatest(M.add_time, M.order_time) <= F.lit(now)), 1).otherwise(0)).alias("backlog"),
        F.sum(F.when(finished_recently, 1).otherwise(0)).alias("finished"),
        F.sum(F.when(finished_recently & has_status([MessageStatus.FAIL]), 1).otherwise(0)).alias("failed"),
        F.sum(F.when(overrun_lease, 1).otherwise(0)).alias("lease_overrun"),
        F.min(F.when(due_new, F.col(M.effect_time))).alias("oldest_due"),
    ).withColumn(
        "due_age", F.coalesce((F.unix_micros(F.lit(now)) - F.unix_micros("oldest_due")) / F.lit(1e6), F.lit(0.0))
    ).drop("oldest_due")


def raised(figures: DataFrame, topics: DataFrame) -> DataFrame:
    """(topic, kind, value, threshold) for every figure above its topic's threshold.

    ``topics`` has the topic table's name, alarm_backlog, alarm_failure_rate and alarm_due_age
    (NULL: no alarm)."""
    joined = figures.join(topics.withColumnRenamed(TOPIC.topic_name, M.topic), M.topic, "left")
    rate = F.when(F.col("finished") > 0, F.col("failed") / F.col("finished")).otherwise(F.lit(0.0))
    checks = [
        ("backlog", F.col("backlog").cast("double"), F.col(TOPIC.alarm_backlog).cast("double")),
        ("failure_rate", rate, F.col(TOPIC.alarm_failure_rate).cast("double")),
        ("lease_overrun", F.col("lease_overrun").cast("double"), F.lit(0.0)),
        ("due_age", F.col("due_age").cast("double"), F.col(TOPIC.alarm_due_age).cast("double")),
    ]
    parts = [joined.select(M.topic, F.lit(kind).alias("kind"), value.alias("value"), threshold.alias("threshold"))
             for kind, value, threshold in checks]
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    return union.where(F.col("threshold").isNotNull() & (F.col("value") > F.col("threshold")))
