"""A real Prometheus scrapes a broker process and a worker process under load; what PromQL says
must agree with what the database holds."""

from __future__ import annotations

import bisect
import json
import re
import subprocess
import threading
from pathlib import Path

from tests.observe import all_messages
from tests.processes import TIDEMQ, process_env, start_broker_process
from tests.servers import free_port, wait_until
from tidemq import Client
from tidemq.metrics import LATENESS_BUCKETS
from tidemq_broker.storages import open_storage

TOPIC = "metrics.queue"
IMMEDIATE, DELAYED, FAR = 3000, 300, 7  # due now, due within 2 s, due in an hour (stay NEW)


def _scalar(prometheus, promql: str):
    """The single value of an instant query, or None while it has none."""
    result = prometheus.query(promql)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _bucket_floor(value: float) -> float:
    """The largest lateness bucket bound at or below ``value`` (0 below the first)."""
    i = bisect.bisect_right(LATENESS_BUCKETS, value)
    return LATENESS_BUCKETS[i - 1] if i else 0.0


def _bucket_ceiling(value: float) -> float:
    i = bisect.bisect_left(LATENESS_BUCKETS, value)
    return LATENESS_BUCKETS[i] if i < len(LATENESS_BUCKETS) else float("inf")


def test_prometheus_counts_and_lateness_agree_with_the_database(settings, spawn, tmp_path, prometheus, request):
    job = request.node.name
    broker_metrics, worker_metrics = free_port(), free_port()
    env = process_env(settings, E2E_LOG=str(tmp_path / "handled.log"), E2E_TOPIC=TOPIC)
    start_broker_process(spawn, tmp_path, {**env, "TIDEMQ_METRICS_PORT": str(broker_metrics)})
    spawn("worker", [*TIDEMQ, "worker", "tests.integration.handlers_e2e", "--drain-timeout", "5",
                     "--metrics-port", str(worker_metrics)], env)
    prometheus.scrape(job, f"127.0.0.1:{broker_metrics}", f"127.0.0.1:{worker_metrics}")
    client = Client(settings)
    storage = open_storage(settings.db_url)
    sel = f'test="{job}"'
    try:
        wait_until(lambda: len(client.coordinator.consumers(TOPIC)) == 1, 30, what="the worker registered")
        wait_until(lambda: sum(t["health"] == "up" for t in prometheus.active_targets()
                               if t["labels"].get("test") == job) == 2, 30, 0.2, "both targets scraped")

        def produce(part: int) -> None:  # four producers at once: group commits of several calls
            for start in range(part * 50, IMMEDIATE, 200):
                client.produce_many(TOPIC, [{"n": n} for n in range(start, start + 50)])

        threads = [threading.Thread(target=produce, args=(part,)) for part in range(4)]
        for thread in threads:
            thread.start()
        for n in range(DELAYED):
            client.produce(TOPIC, {"delayed": n}, delay=1.0 + n / DELAYED)
        for thread in threads:
            thread.join(120)
        client.produce_many(TOPIC, [{"far": n} for n in range(FAR)], delay=3600)
        handled = IMMEDIATE + DELAYED
        wait_until(lambda: storage.counts.count_by_status(TOPIC).get(TOPIC, {}).get("SUCCESS") == handled, 120, 0.1,
                   "every due message SUCCESS")
        stored = sum(storage.counts.count_by_status(TOPIC)[TOPIC].values())
        assert stored == handled + FAR

        # Counters: Prometheus catches up within a few scrapes.
        produced = f'sum(tidemq_messages_produced_total{{{sel},topic="{TOPIC}"}})'
        wait_until(lambda: _scalar(prometheus, produced) == stored, 30, 0.2, f"{produced} == {stored}")
        succeeded = f'sum(tidemq_messages_succeeded_total{{{sel},topic="{TOPIC}"}})'
        wait_until(lambda: _scalar(prometheus, succeeded) == handled, 30, 0.2, f"{succeeded} == {handled}")
        # Each target is scraped on its own schedule: wait for the broker's scrape too.
        delivered = f'sum(tidemq_messages_delivered_total{{{sel},topic="{TOPIC}"}})'
        wait_until(lambda: (_scalar(prometheus, delivered) or 0) >= handled, 30, 0.2, f"{delivered} >= {handled}")
        assert _scalar(prometheus, f"sum(tidemq_group_commit_rows_sum{{{sel}}})") == stored
        # The client shares RPCs between concurrent calls, the broker commits between RPCs.
        calls = IMMEDIATE // 50 + DELAYED + 1
        rpcs = _scalar(prometheus, f"sum(tidemq_produce_duration_seconds_count{{{sel}}})")
        assert 0 < rpcs <= calls
        assert _scalar(prometheus, f"sum(tidemq_group_commit_rows_count{{{sel}}})") <= rpcs

        # Backlog gauges, from the leader's grouped query: the far messages wait, nothing is due.
        scheduled = f'tidemq_backlog_scheduled_messages{{{sel},topic="{TOPIC}"}}'
        wait_until(lambda: _scalar(prometheus, scheduled) == FAR, 30, 0.2, f"{scheduled} == {FAR}")
        wait_until(lambda: _scalar(prometheus, f'tidemq_backlog_due_messages{{{sel},topic="{TOPIC}"}}') == 0,
                   30, 0.2, "no due backlog")
        assert _scalar(prometheus, f'tidemq_oldest_due_age_seconds{{{sel},topic="{TOPIC}"}}') == 0

        # Lateness: every handler start observed once; its median lies between what the stored
        # times allow (lease time and ack time), within the histogram's bucket resolution.
        count = f'sum(tidemq_lateness_seconds_count{{{sel},topic="{TOPIC}"}})'
        wait_until(lambda: _scalar(prometheus, count) == handled, 30, 0.2, f"{count} == {handled}")
        rows = [m for m in all_messages(storage, TOPIC) if m.status == "SUCCESS"]
        earliest = [(m.start_time - m.effect_time).total_seconds() for m in rows]
        latest = [(m.finish_time - m.effect_time).total_seconds() for m in rows]
        for q in (0.5, 0.99):
            promql = f'histogram_quantile({q}, sum by (le) (tidemq_lateness_seconds_bucket{{{sel},topic="{TOPIC}"}}))'
            measured = _scalar(prometheus, promql)
            low, high = _quantile(earliest, q), _quantile(latest, q)
            assert measured is not None, promql
            print(f"lateness p{q * 100:g}: Prometheus {measured * 1000:.1f} ms, stored times allow "
                  f"{low * 1000:.1f}-{high * 1000:.1f} ms")
            assert _bucket_floor(low) <= measured <= _bucket_ceiling(high), (q, measured, low, high)

        # Process figures of both processes.
        assert len(prometheus.query(f"process_resident_memory_bytes{{{sel}}}")) == 2
    finally:
        prometheus.forget(job)
        client.close()
        storage.close()


ROOT = Path(__file__).resolve().parents[2]


def test_alert_rules_pass_promtool_and_fire_on_made_up_series():
    rules = ROOT / "docs" / "prometheus-rules.yml"
    checked = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(["promtool", "test", "rules", "prometheus_rules_test.yml"], capture_output=True,
                            text=True, cwd=Path(__file__).parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_dashboard_and_rule_expression_is_valid_promql_over_metrics_we_export(prometheus):
    import prometheus_client
    import tidemq_admin.metrics  # noqa: F401
    import tidemq_broker.metrics  # noqa: F401

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    exported = {family.name + suffix for family in prometheus_client.REGISTRY.collect()
                for suffix in suffixes.get(family.type, ("",))}
    exported |= {sample.name for family in prometheus_client.REGISTRY.collect() for sample in family.samples}
    exported |= {f"tidemq_{name}" for name in ("backlog_due_messages", "backlog_scheduled_messages",
                                               "running_messages", "oldest_due_age_seconds",
                                               "backlog_refresh_timestamp_seconds")}
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    expressions += re.findall(r"expr: >-\n((?:          .*\n)+)|expr: (.*)\n",
                              (ROOT / "docs" / "prometheus-rules.yml").read_text())
    expressions = [e if isinstance(e, str) else (e[0] or e[1]) for e in expressions]
    assert len(expressions) > 20
    for expr in expressions:
        promql = expr.replace("$__rate_interval", "1m").replace("$topic", ".*").replace("$job", ".*")
        prometheus.query(promql)  # raises on a syntax error
        for name in re.findall(r"\b(tidemq_[a-z_]+|process_[a-z_]+)\b", promql):
            assert name in exported, f"{name} in {expr!r} is not a metric tidemq exports"
