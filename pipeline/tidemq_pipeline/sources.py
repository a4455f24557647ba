"""The message history as one DataFrame: the live table over JDBC plus the Parquet archive."""

from __future__ import annotations

from typing import Optional

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from . import frames, store
from .database import Database

__all__ = ["MESSAGE_COLUMNS", "live_messages", "archived_messages", "all_messages"]

MESSAGE_COLUMNS = ("id", "topic", "data", "status", "effect_time", "order_time", "retry_remaining", "retry_schedule",
                   "attempt", "ttr", "lease_token", "lease_expire", "consumer", "unique_key", "version", "trace",
                   "add_time", "update_time", "start_time", "finish_time")


def live_messages(spark, db: Database, where: str = "", partitions: Optional[int] = None) -> DataFrame:
    """tidemq_message over JDBC (optionally filtered in MySQL by ``where``), read as parallel id ranges."""
    partitions = partitions or max(1, spark.sparkContext.defaultParallelism)
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT MIN(id), MAX(id) FROM {store.MESSAGE}")
            low, high = cur.fetchone()
    finally:
        conn.close()
    query = f"(SELECT * FROM {store.MESSAGE}{' WHERE ' + where if where else ''}) AS live"
    options = db.jdbc_options(dbtable=query)
    if low is not None and partitions > 1 and high - low > partitions:
        options.update(partitionColumn="id", lowerBound=str(low), upperBound=str(high + 1), numPartitions=str(partitions))
    return spark.read.format("jdbc").options(**options).load().select(*MESSAGE_COLUMNS)


def archived_messages(spark, archive_path: Optional[str]) -> Optional[DataFrame]:
    """The archive's rows (message columns only), or None when there is no archive yet."""
    if not archive_path:
        return None
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(archive_path)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(path) or not fs.globStatus(jvm.org.apache.hadoop.fs.Path(archive_path.rstrip("/") + "/topic=*")):
        return None
    return spark.read.parquet(archive_path).select(*MESSAGE_COLUMNS)


def all_messages(spark, db: Database, archive_path: Optional[str]) -> DataFrame:
    """Live and archived messages, each message once (its most recent copy)."""
    live = live_messages(spark, db).withColumn("_source", F.lit(0))
    archived = archived_messages(spark, archive_path)
    if archived is None:
        return live.drop("_source")
    return frames.newest_copy(live.unionByName(archived.withColumn("_source", F.lit(1))))
