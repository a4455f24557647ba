"""The message history as one DataFrame: the live table over JDBC plus the Parquet archive."""

from __future__ import annotations

from typing import Optional

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tidemq.tables import MESSAGE as M

from . import frames
from .database import Database

__all__ = ["live_messages", "archived_messages", "all_messages"]


def live_messages(spark, db: Database, where: str = "", partitions: Optional[int] = None) -> DataFrame:
    """tidemq_message over JDBC (optionally filtered in MySQL by ``where``), read as parallel id ranges."""
    partitions = partitions or max(1, spark.sparkContext.defaultParallelism)
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT MIN({M.id}), MAX({M.id}) FROM {M.name}")
            low, high = cur.fetchone()
    finally:
        conn.close()
    query = f"(SELECT * FROM {M.name}{' WHERE ' + where if where else ''}) AS live"
    options = db.jdbc_options(dbtable=query)
    if low is not None and partitions > 1 and high - low > partitions:
        options.update(partitionColumn=M.id, lowerBound=str(low), upperBound=str(high + 1),
                       numPartitions=str(partitions))
    return spark.read.format("jdbc").options(**options).load().select(*M.columns())


def archived_messages(spark, archive_path: Optional[str]) -> Optional[DataFrame]:
    """The archive's rows (message columns only), or None when there is no archive yet.

    The archive grows over the years while the table gains columns: the files' schemas are
    merged, a file older than a column reads it as NULL, and a column no file has yet is left
    out (callers union by name, or let the table's default fill it on restore)."""
    if not archive_path:
        return None
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(archive_path)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(path) or not fs.globStatus(jvm.org.apache.hadoop.fs.Path(archive_path.rstrip("/") + "/topic=*")):
        return None
    archived = spark.read.option("mergeSchema", "true").parquet(archive_path)
    return archived.select(*[name for name in M.columns() if name in archived.columns])


def all_messages(spark, db: Database, archive_path: Optional[str]) -> DataFrame:
    """Live and archived messages, each message once (its most recent copy)."""
    live = live_messages(spark, db).withColumn("_source", F.lit(0))
    archived = archived_messages(spark, archive_path)
    if archived is None:
        return live.drop("_source")
    both = live.unionByName(archived.withColumn("_source", F.lit(1)), allowMissingColumns=True)
    return frames.newest_copy(both)
