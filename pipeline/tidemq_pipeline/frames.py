"""Pure DataFrame transforms of the archive: what a Parquet row looks like and how batches are
counted. No I/O here, so the same functions serve the job, the tests and the benchmark."""

from __future__ import annotations

from datetime import date

from typing import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tidemq.lifecycle import MessageStatus
from tidemq.tables import MESSAGE as M

__all__ = ["PARTITION_COLUMNS", "ARCHIVE_OMITS", "has_status", "for_archive", "partition_counts", "newest_copy"]

#: The archive's directory levels: root/topic=T/day=YYYY-MM-DD/archive_batch=N/part-*.parquet.
#: The batch level lets a rerun remove exactly the files of a batch that was cut short.
PARTITION_COLUMNS = (M.topic, "day", "archive_batch")
#: Message columns the archive leaves out: what only a message still waiting needs. A restore
#: puts the table's default back (0: a restored message waits on nothing).
ARCHIVE_OMITS = (M.deps_left,)


def has_status(statuses: Iterable[MessageStatus]) -> Column:
    """The Spark condition: the message's status is one of ``statuses``."""
    return F.col(M.status).isin(*[s.value for s in statuses])


def for_archive(messages: DataFrame, batch_id: int) -> DataFrame:
    """Message rows (every column, trace and ``workflow_id`` included, but ``deps_left``: a
    finished message waits on nothing) plus their partition columns: the UTC day the message
    finished and the batch that moved it."""
    return (messages.drop(*ARCHIVE_OMITS).withColumn("day", F.to_date(M.finish_time))
            .withColumn("archive_batch", F.lit(int(batch_id))))


def partition_counts(rows: DataFrame) -> dict[tuple[str, date], int]:
    """Rows per (topic, day), collected to the driver (one entry per partition: small)."""
    return {(r[M.topic], r["day"]): int(r["count"]) for r in rows.groupBy(M.topic, "day").count().collect()}


def newest_copy(messages: DataFrame) -> DataFrame:
    """One row per message id, the most recently updated one.

    A dead letter restored from the archive and archived again exists twice there, and a
    restored one is also live; statistics must count each message once, as it is now."""
    from pyspark.sql import Window

    latest = Window.partitionBy(M.id).orderBy(F.col(M.update_time).desc(), F.col("_source").asc())
    return (messages.withColumn("_rank", F.row_number().over(latest)).where(F.col("_rank") == 1)
            .drop("_rank", "_source"))
