"""Topic settings, the dashboard's figures and charts, and the cluster page from ZooKeeper."""

from __future__ import annotations

import threading

from tidemq import clock
from tidemq.coordinators.zookeeper import ZooKeeperCoordinator
from tidemq_broker.schema import alarm, topic_stats
from tidemq_broker.storage import hours_ago

from tests.admin.conftest import fail_all, produce
from tests.servers import wait_until

SETTINGS = {"retry_count": "5", "retry_base": "2", "retry_max": "120", "ttr": "30", "retention_days": "3",
            "max_data_bytes": "2048", "max_deliveries": "4", "alarm_backlog": "1000", "alarm_failure_rate": "0.2",
            "alarm_due_age": "300", "description": "order closing"}


def _topic(storage, name):
    return next(t for t in storage.topics.list_topics() if t.name == name)


def test_topics_list_and_edit(admin, storage):
    produce(storage, "orders", ['{"a": 1}'])
    assert "orders" in admin.get("/topics").get_data(as_text=True)
    resp = admin.post("/topics/orders/edit", SETTINGS)
    assert resp.status_code == 302
    t = _topic(storage, "orders")
    assert (t.retry_count, t.retry_base, t.retry_max, t.ttr, t.retention_days) == (5, 2.0, 120.0, 30, 3)
    assert t.max_deliveries == 4
    assert (t.max_data_bytes, t.alarm_backlog, t.alarm_failure_rate, t.alarm_due_age) == (2048, 1000, 0.2, 300)
    html = admin.get("/topics").get_data(as_text=True)
    assert "backlog &gt; 1000" in html and "order closing" in html
    assert 'title="an expired lease after this many deliveries' in html and ">4</td>" in html


def test_topic_max_deliveries_is_edited_and_its_limit_named(admin, storage):
    """max_deliveries (how many deliveries before an expiring lease fails a poison message) is
    shown in the form, saved, and refused outside 1..1000 with the limit in the message."""
    produce(storage, "orders", ['{"a": 1}'])
    form = admin.get("/topics/orders/edit").get_data(as_text=True)
    assert 'name="max_deliveries" value="10"' in form
    for bad, message in (("0", "max deliveries must be between 1 and 1000"),
                         ("1001", "max deliveries must be between 1 and 1000"),
                         ("lots", "max deliveries must be a whole number"),
                         ("", "required")):
        resp = admin.post("/topics/orders/edit", {**SETTINGS, "max_deliveries": bad})
        assert resp.status_code == 400, bad
        html = resp.get_data(as_text=True)
        assert 'id="err-max_deliveries"' in html and message in html, bad
        assert _topic(storage, "orders").max_deliveries == 10
    assert admin.post("/topics/orders/edit", {**SETTINGS, "max_deliveries": "1000"}).status_code == 302
    assert _topic(storage, "orders").max_deliveries == 1000
    admin.post("/topics/orders/pause")  # pausing keeps the other settings
    assert _topic(storage, "orders").max_deliveries == 1000


def test_topic_result_retention_is_a_setting_whose_limit_is_named(admin, storage):
    produce(storage, "orders", ['{"a": 1}'])
    form = admin.get("/topics/orders/edit").get_data(as_text=True)
    assert 'name="result_retention_seconds" value=""' in form and 'placeholder="86400 (a day)"' in form
    assert admin.post("/topics/orders/edit", {**SETTINGS, "result_retention_seconds": "3600"}).status_code == 302
    assert _topic(storage, "orders").result_retention_seconds == 3600
    resp = admin.post("/topics/orders/edit", {**SETTINGS, "result_retention_seconds": "-1"})
    assert resp.status_code == 400 and "result retention (seconds) must be between 0 and" in resp.get_data(as_text=True)
    assert _topic(storage, "orders").result_retention_seconds == 3600
    assert admin.post("/topics/orders/edit", SETTINGS).status_code == 302  # empty: back to the default
    assert _topic(storage, "orders").result_retention_seconds is None


def test_topic_edit_errors_are_named_and_nothing_saved(admin, storage):
    produce(storage, "orders", ['{"a": 1}'])
    bad = {**SETTINGS, "ttr": "0", "alarm_failure_rate": "2", "retry_base": "100", "retry_max": "10", "retry_count": ""}
    resp = admin.post("/topics/orders/edit", bad)
    assert resp.status_code == 400
    html = resp.get_data(as_text=True)
    assert ("time to run (seconds) must be between 1" in html
            and "failure rate threshold must be between 0 and 1" in html)
    assert "backoff cap must be at least the backoff base" in html and 'id="err-retry_count"' in html
    assert _topic(storage, "orders").ttr == 60


def test_pause_and_resume(admin, storage):
    produce(storage, "orders", ['{"a": 1}'])
    admin.post("/topics/orders/pause")
    assert _topic(storage, "orders").paused
    assert "PAUSED" in admin.get("/topics").get_data(as_text=True)
    admin.post("/topics/orders/resume")
    assert not _topic(storage, "orders").paused


def test_dashboard_counts_backlog_and_no_report_yet(admin, storage):
    produce(storage, "orders", ['{"a": 1}', '{"a": 2}'])
    produce(storage, "orders", ['{"later": 1}'], delay=3600)
    fail_all(storage, "orders", limit=1)
    html = admin.get("/").get_data(as_text=True)
    assert 'id="topic-orders"' in html
    assert "Due now</dt><dd>1</dd>" in html and "Scheduled later</dt><dd>1</dd>" in html
    assert "No hourly report yet" in html


def test_dashboard_draws_charts_and_alarms_from_pipeline_tables(admin, storage, mysql_db):
    produce(storage, "orders", ['{"a": 1}'])
    now = clock.now()
    rows = [{"topic": "orders", "hour": hours_ago(now, h), "produced": 100 + h, "succeeded": 90, "failed": h,
             "retried": 1, "lease_expired": 0, "backlog": 5, "lateness_p50_ms": 3.0, "lateness_p95_ms": 12.5,
             "lateness_p99_ms": 40.0, "duration_p50_ms": None, "duration_p95_ms": None, "duration_p99_ms": None,
             "computed_at": now} for h in range(6)]
    with mysql_db.engine.begin() as conn:  # the pipeline writes these tables; stand in for it
        conn.execute(topic_stats.insert(), rows)
        conn.execute(alarm.insert(), [{"topic": "orders", "kind": "backlog", "value": 5000, "threshold": 1000,
                                       "message": "<b>backlog</b> too high", "raised_at": now, "resolved_at": None}])
    html = admin.get("/").get_data(as_text=True)
    assert html.count('<svg class="chart"') == 2
    assert "orders: delay lateness" in html and "<polyline" in html
    assert "Open alarms" in html and "&lt;b&gt;backlog&lt;/b&gt; too high" in html


def test_cluster_shows_brokers_leader_and_consumers_with_rank(admin, settings):
    zk = ZooKeeperCoordinator(settings.zk_hosts, settings.zk_root)
    zk.start()
    try:
        zk.register_broker("10.0.0.5:50051")
        first = zk.register_consumer("orders", "hostA-100")
        zk.register_consumer("orders", "hostB-200")
        zk.register_consumer("sms", "hostA-100")
        elected = threading.Event()
        end = zk.run_for_leader("10.0.0.5:50051", lambda lost: (elected.set(), lost.wait()))
        elected.wait(15)

        def page():
            html = admin.get("/cluster").get_data(as_text=True)
            return html if "10.0.0.5:50051</li>" in html else None

        html = wait_until(page, 15, what="broker listed on the cluster page")
        assert "Maintenance leader" in html and '<p class="mono">10.0.0.5:50051</p>' in html
        assert "hostA-100" in html and "hostB-200" in html
        assert "0 / 2" in html and "1 / 2" in html and "0 / 1" in html
        zk.unregister_consumer(first)
        html = admin.get("/cluster").get_data(as_text=True)
        assert "0 / 2" not in html and html.count("0 / 1") == 2  # hostB took rank 0 of orders
        end()
    finally:
        zk.stop()


def test_cluster_says_when_nothing_runs(admin):
    html = admin.get("/cluster").get_data(as_text=True)
    assert "No broker is registered" in html and "No consumer is registered" in html
