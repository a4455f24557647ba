"""The archive job: finished messages past their topic's retention move from MySQL to Parquet.

Each batch (an id range and the cutoffs fixed when it started) goes through the manifest table
tidemq_archive_batch: PENDING -> Parquet written under its own archive_batch=N directories ->
counts per (topic, day) compared with MySQL -> WRITTEN -> rows deleted in id chunks -> DONE.
Killed at any point, the next run first finishes what the manifest says is open: a PENDING
batch's files are removed and written again, a WRITTEN batch's rows are deleted. Rows are
deleted only after their Parquet copy is verified, and never written twice, so nothing is lost
or duplicated.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from datetime import date
from typing import Optional

from tidemq.errors import TidemqError
from tidemq.tables import MESSAGE as M

from . import frames, store
from .store import BatchState
from .database import Database
from .progress import JobSummary

__all__ = ["LOCK_NAME", "run_archive", "read_batch", "ArchiveFiles"]

LOCK_NAME = "tidemq_pipeline_archive"
DELETE_CHUNK = 20_000  # ids per DELETE transaction: short row locks, a bounded undo log


class ArchiveFiles:
    """The archive directory on any Hadoop-compatible file system, through Spark's own client."""

    def __init__(self, spark, root: str) -> None:
        self.spark = spark
        self.root = root.rstrip("/")
        jvm = spark._jvm
        self._path = jvm.org.apache.hadoop.fs.Path
        self._fs = self._path(self.root).getFileSystem(spark._jsc.hadoopConfiguration())

    def batch_glob(self, batch_id: int) -> str:
        return f"{self.root}/topic=*/day=*/archive_batch={batch_id}"

    def remove_batch(self, batch_id: int) -> int:
        """Delete every directory of a batch (after a crash mid-write); return how many."""
        found = self._fs.globStatus(self._path(self.batch_glob(batch_id))) or []
        for status in found:
            self._fs.delete(status.getPath(), True)
        return len(found)

    def remove_leftovers(self) -> None:
        """A write killed before its commit leaves _temporary behind; nothing reads it."""
        temporary = self._path(self.root + "/_temporary")
        if self._fs.exists(temporary):
            self._fs.delete(temporary, True)

    def counts(self, batch_id: int) -> dict[tuple[str, date], int]:
        """Rows per (topic, day) the batch's Parquet files hold, read back from the files."""
        found = [str(s.getPath().toString())
                 for s in (self._fs.globStatus(self._path(self.batch_glob(batch_id))) or [])]
        if not found:
            return {}
        rows = self.spark.read.option("basePath", self.root).parquet(*found)
        return frames.partition_counts(rows)


def read_batch(spark, db: Database, id_from: int, id_to: int, predicate: str, partitions: int):
    """The archivable rows of [id_from, id_to) over JDBC, split into ``partitions`` id ranges
    read in parallel."""
    query = f"(SELECT * FROM {M.name} WHERE {M.id} >= {int(id_from)} AND {M.id} < {int(id_to)} AND {predicate}) AS src"
    options = db.jdbc_options(dbtable=query)
    if partitions > 1 and id_to - id_from > partitions:
        options.update(partitionColumn=M.id, lowerBound=str(id_from), upperBound=str(id_to),
                       numPartitions=str(partitions))
    return spark.read.format("jdbc").options(**options).load()


def run_archive(spark, db: Database, archive_path: str, batch_rows: int = 500_000, partitions: Optional[int] = None,
                min_age: float = 60.0, summary: Optional[JobSummary] = None) -> JobSummary:
    """Move every archivable message to ``archive_path``; return the counters of the run."""
    if batch_rows < 1:
        raise TidemqError(f"--batch-rows must be at least 1, got {batch_rows}")
    summary = summary or JobSummary("archive")
    partitions = partitions or max(1, spark.sparkContext.defaultParallelism)
    conn = db.connect()
    job = None
    try:
        if not store.try_lock(conn, LOCK_NAME):
            raise TidemqError("another archive job holds the archive lock on this database; wait for it to finish")
        files = ArchiveFiles(spark, archive_path)
        files.remove_leftovers()
        job = _Job(spark, db, conn, files, partitions, summary)
        for batch in store.open_batches(conn):
            summary.progress(f"resuming batch {batch.id} ({batch.state}, ids {batch.id_from}..{batch.id_to - 1})")
            job.finish(batch)
        job.drain()  # a resumed batch is done before new cutoffs are computed over the table
        now = store.db_now(conn)
        cutoffs = store.Cutoffs.compute(now, store.topics(conn), min_age)
        low, high, count = store.eligible_bounds(conn, cutoffs)
        summary.progress(f"{count} finished messages to archive from {db.describe()} to {files.root}")
        if count:
            for id_from in range(low, high + 1, batch_rows):
                id_to = min(id_from + batch_rows, high + 1)
                expected = store.partition_counts(conn, id_from, id_to, cutoffs)
                if expected:
                    batch = store.start_batch(conn, id_from, id_to, cutoffs, sum(expected.values()), files.root, now)
                    job.finish(batch, expected)
        job.drain()
        return summary
    finally:
        if job is not None:
            job.close()
        conn.close()


class _Job:
    """Carries one batch from its manifest state to DONE.

    The deletes of a verified batch run on a second connection while Spark reads and writes the
    next batch (disjoint id ranges), so MySQL's delete work overlaps Spark's."""

    def __init__(self, spark, db: Database, conn, files: ArchiveFiles, partitions: int, summary: JobSummary) -> None:
        self.spark, self.db, self.conn, self.files = spark, db, conn, files
        self.partitions, self.summary = partitions, summary
        self._deleter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="archive-delete")
        self._delete_conn = None
        self._pending: list[Future] = []

    def finish(self, batch: store.BatchRow, expected: Optional[dict] = None) -> None:
        if batch.state is BatchState.PENDING:
            self.write(batch, expected)
        self._pending.append(self._deleter.submit(self.delete, batch))
        for future in [f for f in self._pending if f.done()]:
            future.result()  # a failed delete stops the run at once
            self._pending.remove(future)

    def drain(self) -> None:
        """Wait for the deletes submitted so far; raise the first error one of them met."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def close(self) -> None:
        self._deleter.shutdown(wait=True)
        if self._delete_conn is not None:
            self._delete_conn.close()

    def write(self, batch: store.BatchRow, expected: Optional[dict]) -> None:
        if self.files.remove_batch(batch.id):
            self.summary.progress(f"batch {batch.id}: removed the files of an interrupted write")
        if expected is None:
            expected = store.partition_counts(self.conn, batch.id_from, batch.id_to, batch.cutoffs)
        total = sum(expected.values())
        if total:
            rows = read_batch(self.spark, self.db, batch.id_from, batch.id_to, batch.cutoffs.predicate(),
                              self.partitions)
            (frames.for_archive(rows, batch.id).write.mode("append")
             .partitionBy(*frames.PARTITION_COLUMNS).parquet(self.files.root))
        written = self.files.counts(batch.id)
        if written != expected:
            diff = sorted(f"{t}/{d}: mysql={expected.get((t, d), 0)} parquet={written.get((t, d), 0)}"
                          for t, d in set(expected) | set(written) if expected.get((t, d)) != written.get((t, d)))
            raise TidemqError(f"archive batch {batch.id}: Parquet counts differ from MySQL ({'; '.join(diff[:5])}); "
                              "nothing was deleted; run the archive again (it rewrites this batch)")
        self.summary.read += total
        self.summary.written += total
        store.set_batch_state(self.conn, batch.id, BatchState.WRITTEN, store.db_now(self.conn), written=total,
                              expected=total)
        self.summary.progress(f"batch {batch.id}: {total} rows written to Parquet and verified "
                              f"({len(written)} topic/day partitions)")

    def delete(self, batch: store.BatchRow) -> None:
        if self._delete_conn is None:
            self._delete_conn = self.db.connect()
        conn = self._delete_conn
        deleted = 0
        for start in range(batch.id_from, batch.id_to, DELETE_CHUNK):
            deleted += store.delete_range(conn, start, min(start + DELETE_CHUNK, batch.id_to), batch.cutoffs)
        self.summary.deleted += deleted
        store.set_batch_state(conn, batch.id, BatchState.DONE, store.db_now(conn), deleted=deleted)
        self.summary.progress(f"batch {batch.id}: {deleted} rows deleted from MySQL")
