"""The alarm job (thresholds crossed -> rows + webhook, cleared -> resolved) and restore from
the archive, against real MariaDB and local Spark."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.spark.data import insert_rows, message_rows, query, set_topic
from tidemq.errors import ValidationError
from tidemq_pipeline.alarm import run_alarm
from tidemq_pipeline.archive import run_archive
from tidemq_pipeline.notifiers import LogNotifier, WebhookNotifier
from tidemq_pipeline.restore import run_restore


@pytest.fixture
def webhook():
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", received
    server.shutdown()
    server.server_close()


def _row(i, topic, status, now, age, **kw):
    moment = (now - timedelta(seconds=age)).replace(microsecond=0)
    row = {"id": i, "topic": topic, "data": "{}", "status": status, "effect_time": moment, "order_time": moment,
           "retry_remaining": 0, "retry_schedule": None, "attempt": 1, "ttr": 30, "lease_token": None,
           "lease_expire": None, "consumer": None, "unique_key": None, "version": 1, "trace": "", "add_time": moment,
           "update_time": moment, "start_time": None, "finish_time": None, "trace_context": None, "priority": 0,
           "flow_key": None, "result": None, "progress": None, "cancel_requested": 0, "deps_left": 0,
           "workflow_id": None, "wait_mode": 0, "deps_failed": 0}
    row.update(kw)
    return row


def test_topic_over_its_thresholds_raises_alarms_once_and_resolves_them(spark, db, webhook):
    url, received = webhook
    now = datetime.utcnow()
    set_topic(db, "t.hot", alarm_backlog=5, alarm_failure_rate=0.25, alarm_due_age=120)
    set_topic(db, "t.calm", alarm_backlog=1000, alarm_failure_rate=0.9, alarm_due_age=3600)
    rows = [_row(i, "t.hot", "NEW", now, 600 + i) for i in range(1, 9)]                     # 8 due, oldest 608 s
    rows += [_row(i, "t.hot", "NEW", now, -3600) for i in range(9, 30)]                       # not due yet
    rows += [_row(i, "t.hot", "FAIL" if i % 2 else "SUCCESS", now, 300, start_time=now - timedelta(seconds=299),
                  finish_time=now - timedelta(seconds=290)) for i in range(30, 34)]           # 2 of 4 failed
    rows += [_row(34, "t.hot", "RUNNING", now, 900, lease_token="x", start_time=now - timedelta(seconds=890),
                  lease_expire=now - timedelta(seconds=800))]
    rows += [_row(i, "t.calm", "NEW", now, 10) for i in range(40, 43)]
    insert_rows(db, rows)

    first = run_alarm(spark, db, [LogNotifier(), WebhookNotifier(url)])

    alarms = {(t, k): (v, th) for t, k, v, th in query(db, "SELECT topic, kind, value, threshold FROM tidemq_alarm")}
    assert set(alarms) == {("t.hot", "backlog"), ("t.hot", "failure_rate"), ("t.hot", "lease_overrun"),
                           ("t.hot", "due_age")}
    assert alarms["t.hot", "backlog"] == (9.0, 5.0)  # 8 due NEW + the RUNNING one
    assert alarms["t.hot", "failure_rate"] == (0.5, 0.25)
    assert alarms["t.hot", "lease_overrun"] == (1.0, 0.0)
    assert alarms["t.hot", "due_age"][0] == pytest.approx(608, abs=30)
    assert first.written == 4 and len(received) == 1
    assert sorted(a["kind"] for a in received[0]["alarms"]) == ["backlog", "due_age", "failure_rate", "lease_overrun"]

    second = run_alarm(spark, db, [WebhookNotifier(url)])  # still over: no new rows, no new notice
    assert second.written == 0 and len(received) == 1
    assert query(db, "SELECT COUNT(*) FROM tidemq_alarm")[0][0] == 4

    query(db, "DELETE FROM tidemq_message WHERE topic = 't.hot' AND status IN ('NEW', 'RUNNING', 'FAIL')")
    run_alarm(spark, db, [])
    assert query(db, "SELECT COUNT(*) FROM tidemq_alarm WHERE resolved_at IS NULL")[0][0] == 0


def test_restore_puts_archived_dead_letters_back_once(spark, db, tmp_path):
    rows = message_rows(600, topics=("t.dead", "t.other"), statuses=("SUCCESS", "FAIL"), seed=5)
    insert_rows(db, rows)
    archive = str(tmp_path / "archive")
    assert run_archive(spark, db, archive).deleted == len(rows)
    since = datetime(2024, 3, 1, 2, 0, 0)
    wanted = {r["id"]: r for r in rows
              if r["topic"] == "t.dead" and r["status"] == "FAIL" and r["finish_time"] >= since}

    summary = run_restore(spark, db, archive, "t.dead", "FAIL", since=since, retry=2)

    assert summary.written == len(wanted) > 0
    live = query(db, "SELECT id, status, retry_remaining, data, trace, finish_time FROM tidemq_message")
    assert {r[0] for r in live} == set(wanted)
    for msg_id, status, retry, data, trace, finish in live:
        assert (status, retry, data, finish) == ("NEW", 2, wanted[msg_id]["data"], None)
        assert trace.startswith(wanted[msg_id]["trace"])
        assert " RESTORED source=archive retries=2" in trace.splitlines()[-1]
    again = run_restore(spark, db, archive, "t.dead", "FAIL", since=since)
    assert (again.read, again.written) == (len(wanted), 0)
    with pytest.raises(ValidationError, match="--status must be one of SUCCESS, FAIL"):
        run_restore(spark, db, archive, "t.dead", "NEW")
