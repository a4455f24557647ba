"""The KEDA ScaledObject of docs/keda-scaledobject.yaml: its query, run by a real Prometheus
scraping a real broker, counts the due and running messages of the worker's topic (scheduled
messages and other topics aside) and answers 0, not nothing, once there are none."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.processes import process_env, start_broker_process
from tests.servers import free_port, wait_until
from tidemq import BatchConsumer, Client

DOC = Path(__file__).resolve().parents[2] / "docs" / "keda-scaledobject.yaml"


def _value(prometheus, promql: str):
    result = prometheus.query(promql)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def test_the_keda_query_follows_the_topic_s_due_and_running_backlog(settings, spawn, tmp_path, prometheus, request):
    scaled = yaml.safe_load(DOC.read_text())
    assert scaled["kind"] == "ScaledObject" and scaled["spec"]["minReplicaCount"] == 0
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert float(trigger["metadata"]["threshold"]) > 0
    job = request.node.name  # this test's series only: the session's Prometheus scrapes other tests too
    query = trigger["metadata"]["query"].replace("{topic=~", f'{{test="{job}",topic=~')
    assert query.count(f'test="{job}"') == 2, query

    metrics = free_port()
    start_broker_process(spawn, tmp_path, {**process_env(settings), "TIDEMQ_METRICS_PORT": str(metrics)})
    prometheus.scrape(job, f"127.0.0.1:{metrics}")
    client = Client(settings)
    try:
        wait_until(lambda: any(t["health"] == "up" for t in prometheus.active_targets()
                               if t["labels"].get("test") == job), 30, 0.2, "the broker scraped")
        assert _value(prometheus, query) == 0  # no series at all: still an answer, 0 replicas
        client.produce_many("order.close", [{"n": n} for n in range(7)])
        client.produce_many("order.close", [{"later": n} for n in range(2)], delay=3600)  # scheduled
        client.produce_many("mail.send", [{"n": n} for n in range(5)])  # another worker's topic
        wait_until(lambda: _value(prometheus, query) == 7, 60, 0.2, "7 due messages counted")

        consumer = BatchConsumer("order.close", ttr=60, client=client)
        batch = consumer.pull(max_messages=3, wait=2)
        assert len(batch) == 3
        running = f'tidemq_running_messages{{test="{job}",topic="order.close"}}'
        wait_until(lambda: _value(prometheus, running) == 3, 60, 0.2, "3 running")
        assert _value(prometheus, query) == 7  # 4 due + 3 running: the work still needs its workers
        consumer.ack(succeeded=[m.id for m in batch])
        wait_until(lambda: _value(prometheus, query) == 4, 60, 0.2, "4 left after the acks")
    finally:
        prometheus.forget(job)
        client.close()
