"""Workflows in the pipeline: the archive carries each message's workflow id (and leaves out
deps_left), and the report's workflow figures over live + archived steps match an independent
plain-Python computation on the same generated rows."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from tests.spark.data import BASE, insert_rows, message_rows, query, set_topic
from tidemq_pipeline.archive import run_archive
from tidemq_pipeline.report import run_report
from tidemq_pipeline.restore import run_restore

UNFINISHED = {"NEW", "WAITING", "RUNNING"}


def workflow_rows():
    """600 messages: workflows of five consecutive ids (the first one's id is the workflow's),
    some steps WAITING or CANCELLED, every tenth workflow without one of its own (plain
    messages), and messages stored before a workflow that joined it (a lower id than its own)."""
    rows = message_rows(600, topics=("t.wf.gone", "t.wf.live"), statuses=("SUCCESS", "SUCCESS", "SUCCESS", "FAIL",
                                                                         "NEW", "RUNNING"), hours=8, seed=21)
    for row in rows:
        group = (row["id"] - 1) // 5
        if group % 10 == 9:
            continue  # plain messages
        row["workflow_id"] = group * 5 + 1 if group % 10 != 7 else group * 5 + 3  # 7: two ids below it joined
        if row["status"] == "NEW" and row["id"] % 3 == 0:
            row["status"], row["deps_left"], row["effect_time"] = "WAITING", 1, row["order_time"]
        if row["status"] == "FAIL" and row["id"] % 2 == 0:  # stopped by policy: CANCELLED, finished then
            row["status"], row["deps_left"] = "CANCELLED", 1
    return rows


def expected_figures(rows, since=None):
    steps = defaultdict(list)
    for row in rows:
        if row["workflow_id"] is not None and row["id"] >= row["workflow_id"]:
            steps[row["workflow_id"]].append(row)
    out = {"started": 0, "succeeded": 0, "failed": 0, "cancelled": 0, "running": 0}
    for members in steps.values():
        statuses = {m["status"] for m in members}
        state = ("running" if statuses & UNFINISHED else "failed" if "FAIL" in statuses
                 else "cancelled" if "CANCELLED" in statuses else "succeeded")
        if since is None or min(m["add_time"] for m in members) >= since:
            out["started"] += 1
        if state == "running":
            out["running"] += 1
        elif since is None or max(m["finish_time"] or m["update_time"] for m in members) >= since:
            out[state] += 1
    return out


def test_the_archive_carries_workflow_ids_and_the_report_counts_workflows_by_state(spark, db, tmp_path):
    rows = workflow_rows()
    insert_rows(db, rows)
    set_topic(db, "t.wf.gone", retention_days=0)  # its finished steps move to Parquet
    set_topic(db, "t.wf.live", retention_days=365_000)
    archive = str(tmp_path / "archive")
    moved = run_archive(spark, db, archive, batch_rows=250)
    gone = {r["id"]: r for r in rows if r["topic"] == "t.wf.gone" and r["status"] in ("SUCCESS", "FAIL", "CANCELLED")}
    assert moved.deleted == len(gone) > 0

    stored = {r["id"]: r.asDict() for r in spark.read.parquet(archive).collect()}
    assert set(stored) == set(gone)
    assert all(stored[id]["workflow_id"] == row["workflow_id"] for id, row in gone.items())
    assert any(row["workflow_id"] is not None for row in gone.values())
    assert "deps_left" not in spark.read.parquet(archive).columns

    expected = expected_figures(rows)
    assert all(expected[state] > 0 for state in expected)  # every state occurs: the test can tell them apart
    summary = run_report(spark, db, archive)
    assert {name: summary.extra[f"workflows_{name}"] for name in expected} == expected

    since = BASE + timedelta(hours=4)
    windowed = run_report(spark, db, archive, since=since)
    want = expected_figures(rows, since)
    assert want != expected
    assert {name: windowed.extra[f"workflows_{name}"] for name in want} == want


def test_a_restored_workflow_step_gets_the_default_deps_left(spark, db, tmp_path):
    rows = [row for row in workflow_rows() if row["topic"] == "t.wf.gone"]
    insert_rows(db, rows)
    set_topic(db, "t.wf.gone", retention_days=0)
    archive = str(tmp_path / "archive")
    run_archive(spark, db, archive)
    cancelled = [r for r in rows if r["status"] == "CANCELLED"]
    assert cancelled
    assert run_restore(spark, db, archive, "t.wf.gone", "CANCELLED").written == len(cancelled)
    ids = {r["id"] for r in cancelled}
    live = [row for row in query(db, "SELECT id, status, deps_left, workflow_id FROM tidemq_message") if row[0] in ids]
    assert sorted(live) == sorted((r["id"], "NEW", 0, r["workflow_id"]) for r in cancelled)
