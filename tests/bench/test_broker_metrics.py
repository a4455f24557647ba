"""Reading a process's Prometheus endpoint: samples summed over their label sets."""

from __future__ import annotations

import prometheus_client

from benchmarks import broker_metrics
from tests.servers import free_port


def test_a_read_sums_each_sample_over_its_labels_and_lists_absent_ones_as_zero():
    registry = prometheus_client.CollectorRegistry()
    produced = prometheus_client.Counter("bench_produced", "", ("topic",), registry=registry)
    produced.labels("a b").inc(3)  # a label value with a space in it
    produced.labels("c").inc(4)
    seconds = prometheus_client.Histogram("bench_seconds", "", registry=registry)
    seconds.observe(0.25)
    seconds.observe(0.5)
    port = free_port()
    server, thread = prometheus_client.start_http_server(port, "127.0.0.1", registry)
    try:
        found = broker_metrics.read(port, ["bench_produced_total", "bench_seconds_sum", "bench_seconds_count",
                                           "bench_absent"])
    finally:
        server.shutdown()
        thread.join(5)
    assert found == {"bench_produced_total": 7.0, "bench_seconds_sum": 0.75, "bench_seconds_count": 2.0,
                     "bench_absent": 0.0}
