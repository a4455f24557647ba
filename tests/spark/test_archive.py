"""The archive job against real MariaDB and local Spark: every column kept, counts exact."""

from __future__ import annotations

from tests.spark.data import COLUMNS as MESSAGE_COLUMNS
from tests.spark.data import insert_rows, message_rows, query, set_topic
from tidemq_pipeline import frames
from tidemq_pipeline.archive import read_batch, run_archive
from tidemq_pipeline.report import run_report
from tidemq_pipeline.restore import run_restore
from tidemq_pipeline.sources import archived_messages

COLUMNS = tuple(c for c in MESSAGE_COLUMNS if c not in frames.ARCHIVE_OMITS)  # what the archive keeps


def _archived(spark, path):
    return {r["id"]: r.asDict() for r in spark.read.parquet(str(path)).collect()}


def test_archive_moves_finished_rows_with_every_column_and_is_idempotent(spark, db, tmp_path):
    rows = message_rows(1500, topics=("t.alpha", "t.beta", "t.keep"))
    insert_rows(db, rows)
    set_topic(db, "t.beta", retention_days=0)
    set_topic(db, "t.keep", retention_days=365_000)  # finished long ago, but kept for a thousand years
    archive = tmp_path / "archive"

    summary = run_archive(spark, db, str(archive), batch_rows=400)

    moved = {r["id"]: r for r in rows if r["status"] in ("SUCCESS", "FAIL") and r["topic"] != "t.keep"}
    assert summary.read == summary.written == summary.deleted == len(moved)
    stored = _archived(spark, archive)
    assert set(stored) == set(moved)
    for msg_id, row in moved.items():
        assert {c: stored[msg_id][c] for c in COLUMNS} == {c: row[c] for c in COLUMNS}
        assert not set(frames.ARCHIVE_OMITS) & set(stored[msg_id])
        assert str(stored[msg_id]["day"]) == row["finish_time"].date().isoformat()
    live = {r[0] for r in query(db, "SELECT id FROM tidemq_message")}
    assert live == {r["id"] for r in rows} - set(moved)
    states = query(db, "SELECT state, SUM(expected_rows), SUM(written_rows), SUM(deleted_rows) "
                       "FROM tidemq_archive_batch GROUP BY state")
    assert [(s, int(e), int(w), int(d)) for s, e, w, d in states] == [("DONE", len(moved), len(moved), len(moved))]

    again = run_archive(spark, db, str(archive), batch_rows=400)
    assert (again.read, again.written, again.deleted) == (0, 0, 0)
    assert len(spark.read.parquet(str(archive)).collect()) == len(moved)


def _write_old_archive(spark, db, archive, rows, missing):
    """Archive ``rows`` as a release that predates the ``missing`` columns would have: their
    Parquet files lack those columns. The rows leave MySQL as the archive job's would."""
    insert_rows(db, rows)
    low, high = rows[0]["id"], rows[-1]["id"] + 1
    old = read_batch(spark, db, low, high, "1 = 1", 1).drop(*missing)
    frames.for_archive(old, 999_999).write.mode("append").partitionBy(*frames.PARTITION_COLUMNS).parquet(archive)
    query(db, "DELETE FROM tidemq_message WHERE id >= %s AND id < %s", (low, high))


def test_an_archive_older_than_a_column_is_read_restored_and_reported(spark, db, tmp_path):
    """Parquet files written before a column existed: the column is left out (restore lets the
    table's default fill it) or, once newer files have it, read as NULL from the old ones."""
    archive = str(tmp_path / "archive")
    old = message_rows(120, topics=("t.old",), statuses=("FAIL",), seed=11)
    _write_old_archive(spark, db, archive, old, missing=("unique_key", "retry_schedule"))
    assert {"unique_key", "retry_schedule"}.isdisjoint(archived_messages(spark, archive).columns)

    restored = run_restore(spark, db, archive, "t.old", "FAIL", retry=1)
    assert restored.written == len(old)
    live = query(db, "SELECT status, retry_remaining, unique_key, retry_schedule FROM tidemq_message")
    assert {row for row in live} == {("NEW", 1, None, None)}
    query(db, "DELETE FROM tidemq_message")

    new = message_rows(300, topics=("t.old", "t.new"), statuses=("SUCCESS", "FAIL"), seed=12, start_id=1000)
    insert_rows(db, new)
    assert run_archive(spark, db, archive).deleted == len(new)
    merged = archived_messages(spark, archive)
    assert list(merged.columns) == list(COLUMNS)
    keys = {r["id"]: r["unique_key"] for r in merged.select("id", "unique_key").collect()}
    assert len(keys) == len(old) + len(new)
    assert all(keys[r["id"]] is None for r in old)
    assert all(keys[r["id"]] == r["unique_key"] for r in new)
    assert run_report(spark, db, archive).read == len(old) + len(new)
