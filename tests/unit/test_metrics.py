"""The metrics modules: conventional names, bounded labels, what each helper records, the
leader's backlog collector and the HTTP endpoint."""

from __future__ import annotations

import urllib.request
from datetime import datetime, timedelta, timezone

import prometheus_client
import pytest

import tidemq_admin.metrics  # noqa: F401  (registers the console's metrics)
from tests.servers import free_port
from tidemq import metrics
from tidemq.config import Settings
from tidemq.errors import ConfigurationError
from tidemq.lifecycle import handler_outcome
from tidemq_broker import metrics as broker_metrics
from tidemq_broker.maintenance.backlog import BacklogRefresh
from tidemq_broker.storage import Backlog, NewRow
from tidemq_broker.storages import open_storage

#: Every label a tidemq metric may carry: each takes a bounded set of values, never an id.
BOUNDED_LABELS = {"topic", "outcome", "endpoint", "code", "state"}  # state: a workflow's three ends
UNITS = ("_seconds", "_rows", "_messages", "_total", "_ratio")


def _ours():
    return [family for family in prometheus_client.REGISTRY.collect() if family.name.startswith("tidemq_")]


def _value(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


def test_names_follow_prometheus_conventions_and_labels_are_bounded():
    broker_metrics.BACKLOG.publish("b", [Backlog("t", 1, 2, 3, datetime(2020, 1, 1))], datetime(2020, 1, 1, 0, 1))
    try:
        families = _ours()
    finally:
        broker_metrics.BACKLOG.withdraw("b")
    kinds = {family.name: family.type for family in families}
    assert {"tidemq_messages_produced", "tidemq_messages_delivered", "tidemq_messages_succeeded",
            "tidemq_messages_retried", "tidemq_messages_failed", "tidemq_messages_lease_expired"} <= {
        name for name, kind in kinds.items() if kind == "counter"}
    assert {"tidemq_produce_duration_seconds", "tidemq_group_commit_rows", "tidemq_lock_duration_seconds",
            "tidemq_handler_duration_seconds", "tidemq_lateness_seconds"} <= {
        name for name, kind in kinds.items() if kind == "histogram"}
    assert {"tidemq_backlog_due_messages", "tidemq_backlog_scheduled_messages", "tidemq_running_messages",
            "tidemq_oldest_due_age_seconds", "tidemq_backlog_refresh_timestamp_seconds"} <= {
        name for name, kind in kinds.items() if kind == "gauge"}
    for family in families:
        assert family.documentation, family.name
        exposed = family.name + ("_total" if family.type == "counter" else "")
        assert exposed.endswith(UNITS) or family.name.startswith("tidemq_console_requests"), exposed
        for sample in family.samples:
            assert set(sample.labels) - {"le"} <= BOUNDED_LABELS, (family.name, sample.labels)


def test_lateness_is_measured_from_aware_and_naive_effect_times():
    before = _value("tidemq_lateness_seconds_count", topic="u.late")
    aware = datetime.now(timezone.utc) - timedelta(seconds=2)
    metrics.handler_started("u.late", aware)
    metrics.handler_started("u.late", aware.replace(tzinfo=None))
    assert _value("tidemq_lateness_seconds_count", topic="u.late") == before + 2
    total = _value("tidemq_lateness_seconds_sum", topic="u.late")
    assert 3.9 < total < 5  # two observations of about 2 s


def test_outcomes_split_retries_from_dead_letters():
    started = metrics.handler_started("u.out", datetime.now(timezone.utc))
    for failed, retry_remaining in ((False, 0), (True, 2), (True, 0)):
        metrics.handler_finished("u.out", started, handler_outcome(failed, retry_remaining))
    assert [_value(f"tidemq_messages_{kind}_total", topic="u.out") for kind in ("succeeded", "retried", "failed")] \
        == [1, 1, 1]
    assert _value("tidemq_handler_duration_seconds_count", topic="u.out", outcome="failure") == 2


def test_group_commits_count_rows_per_topic_and_expiries_per_topic():
    now = datetime(2030, 1, 1)
    before = _value("tidemq_messages_produced_total", topic="u.p1")
    broker_metrics.committed([NewRow("u.p1", "1", now, 0), NewRow("u.p1", "2", now, 0), NewRow("u.p2", "3", now, 0)])
    assert _value("tidemq_messages_produced_total", topic="u.p1") == before + 2
    broker_metrics.expired({"u.p1": 4})
    assert _value("tidemq_messages_lease_expired_total", topic="u.p1") == 4


def test_backlog_gauges_come_from_the_leaders_reading_and_go_with_its_leadership(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path}/store.sqlite3")
    storage.schema.create_schema()
    collector = broker_metrics.BacklogCollector()
    registry = prometheus_client.CollectorRegistry()
    registry.register(collector)
    try:
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        storage.messages.insert_messages([NewRow("u.bl", "1", now - timedelta(seconds=30), 0),
                                 NewRow("u.bl", "2", now + timedelta(hours=1), 0)], now)
        job = BacklogRefresh(storage.counts, "broker-a", collector=collector)
        assert registry.get_sample_value("tidemq_backlog_due_messages", {"topic": "u.bl"}) is None
        job.run()
        assert registry.get_sample_value("tidemq_backlog_due_messages", {"topic": "u.bl"}) == 1
        assert registry.get_sample_value("tidemq_backlog_scheduled_messages", {"topic": "u.bl"}) == 1
        assert registry.get_sample_value("tidemq_running_messages", {"topic": "u.bl"}) == 0
        assert 29 < registry.get_sample_value("tidemq_oldest_due_age_seconds", {"topic": "u.bl"}) < 60
        refreshed = registry.get_sample_value("tidemq_backlog_refresh_timestamp_seconds")
        assert abs(refreshed - datetime.now(timezone.utc).timestamp()) < 60
        collector.withdraw("broker-b")  # another broker of the process never removes our reading
        assert registry.get_sample_value("tidemq_backlog_due_messages", {"topic": "u.bl"}) == 1
        job.stop_leading()
        assert registry.get_sample_value("tidemq_backlog_due_messages", {"topic": "u.bl"}) is None
    finally:
        storage.close()


def test_the_port_setting_is_read_from_the_environment_and_checked():
    assert Settings.from_env({}).metrics_port == 0
    assert Settings.from_env({"TIDEMQ_METRICS_PORT": ""}).metrics_port == 0
    settings = Settings.from_env({"TIDEMQ_METRICS_PORT": "9108", "TIDEMQ_METRICS_HOST": "0.0.0.0"})
    assert (settings.metrics_port, settings.metrics_host) == (9108, "0.0.0.0")
    assert Settings.from_env({}, metrics_port=9109).metrics_port == 9109
    assert Settings.from_env({}).metrics_host == "127.0.0.1"
    for bad in ("http", "70000", "-1"):
        with pytest.raises(ConfigurationError, match="TIDEMQ_METRICS_PORT"):
            Settings.from_env({"TIDEMQ_METRICS_PORT": bad})


def test_the_endpoint_serves_tidemq_and_process_metrics_only_when_asked():
    assert metrics.serve_metrics(Settings.from_env({}), "test") is None
    port = free_port()
    server = metrics.serve_metrics(Settings.from_env({}, metrics_port=port), "test")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
        assert "process_resident_memory_bytes" in text and "tidemq_lateness_seconds" in text
        with pytest.raises(ConfigurationError, match="TIDEMQ_METRICS_PORT"):
            metrics.serve_metrics(Settings.from_env({}, metrics_port=port), "test")  # taken
    finally:
        server.shutdown()
