"""The archive job against real MariaDB and local Spark: every column kept, counts exact."""

from __future__ import annotations

from tests.spark.data import COLUMNS, insert_rows, message_rows, query, set_topic
from tidemq_pipeline.archive import run_archive


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
        assert {c: stored[msg_id][c] for c in COLUMNS} == row
        assert str(stored[msg_id]["day"]) == row["finish_time"].date().isoformat()
    live = {r[0] for r in query(db, "SELECT id FROM tidemq_message")}
    assert live == {r["id"] for r in rows} - set(moved)
    states = query(db, "SELECT state, SUM(expected_rows), SUM(written_rows), SUM(deleted_rows) FROM tidemq_archive_batch GROUP BY state")
    assert [(s, int(e), int(w), int(d)) for s, e, w, d in states] == [("DONE", len(moved), len(moved), len(moved))]

    again = run_archive(spark, db, str(archive), batch_rows=400)
    assert (again.read, again.written, again.deleted) == (0, 0, 0)
    assert len(spark.read.parquet(str(archive)).collect()) == len(moved)
