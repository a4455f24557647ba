"""The archive job killed with SIGKILL in the middle of a batch, then run again: every finished
message ends up in Parquet exactly once and nowhere else; the live ones are untouched."""

from __future__ import annotations

import sys

from pyspark.sql import functions as F

from benchmarks.archive_bench import seed_finished
from tests.servers import wait_until
from tests.spark.data import insert_rows, message_rows, query

FINISHED = 150_000
TIDEMQ = [sys.executable, "-m", "tidemq_cli.main"]


def test_archive_killed_mid_batch_and_rerun_loses_and_duplicates_nothing(spark, db, mysql_url, spawn, tmp_path):
    conn = db.connect()
    seed_finished(conn, FINISHED)
    conn.close()
    live = message_rows(300, statuses=("NEW", "RUNNING"), start_id=10_000_000)
    insert_rows(db, live)
    archive = str(tmp_path / "archive")
    cmd = TIDEMQ + ["--db-url", mysql_url, "pipeline", "archive", "--master", "local[2]", "--archive", archive,
                    "--batch-rows", "30000", "--partitions", "2"]

    first = spawn("archive-1", cmd)

    def mid_batch():  # one batch finished, the next one being written
        states = dict(query(db, "SELECT state, COUNT(*) FROM tidemq_archive_batch GROUP BY state"))
        return states.get("DONE", 0) >= 1 and states.get("PENDING", 0) == 1

    wait_until(mid_batch, 240, what="an archive batch in the middle of its write")
    first.kill()
    assert first.wait(10) == -9
    left = query(db, "SELECT COUNT(*) FROM tidemq_message WHERE status IN ('SUCCESS', 'FAIL')")[0][0]
    assert 0 < left < FINISHED  # killed half-way: some moved, some not

    second = spawn("archive-2", cmd)
    assert second.wait(300) == 0, second.log_path.read_text()[-3000:]

    log = second.log_path.read_text()
    assert "spark master local[2]" in log
    summary = [line for line in log.splitlines() if line.startswith("archive: rows read=")]
    assert summary and f"deleted={left}" in summary[-1], log[-2000:]
    stored = spark.read.parquet(archive).agg(F.count("*").alias("rows"),
                                             F.countDistinct("id").alias("ids")).collect()[0]
    assert (stored["rows"], stored["ids"]) == (FINISHED, FINISHED)
    assert query(db, "SELECT COUNT(*) FROM tidemq_message WHERE status IN ('SUCCESS', 'FAIL')")[0][0] == 0
    assert {r[0] for r in query(db, "SELECT id FROM tidemq_message")} == {r["id"] for r in live}
    assert query(db, "SELECT COUNT(*) FROM tidemq_archive_batch WHERE state <> 'DONE'")[0][0] == 0
