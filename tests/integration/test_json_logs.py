"""`tidemq worker` with TIDEMQ_LOG_FORMAT=json: every line it writes is one JSON object, and the
lines about a message name its id, its topic and the trace it was produced in, which the worker
process's handler spans join (a trace across processes and retries)."""

from __future__ import annotations

import json
import signal

from opentelemetry import trace

from tests.otel import exporter
from tests.processes import process_env, start_worker, wait_registered
from tests.servers import wait_until


def test_a_worker_process_logs_json_lines_naming_the_message_and_its_trace(settings, broker, client, spawn,
                                                                             tmp_path):
    exporter().clear()
    spans_file = tmp_path / "spans.jsonl"
    env = process_env(settings, TIDEMQ_LOG_FORMAT="json", SPANS_FILE=str(spans_file))
    worker = start_worker(spawn, "worker", "tests.integration.handlers_logs", env)
    wait_registered(client.coordinator, "logs.json", 1)
    with trace.get_tracer("app").start_as_current_span("checkout") as parent:
        msg_id = client.produce("logs.json", {"order": 42}, retry=[0.1])
    trace_id = format(parent.get_span_context().trace_id, "032x")
    wait_until(lambda: broker.storage.reads.get_message(msg_id).status == "SUCCESS", 30, what="the retry to succeed")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0

    text = worker.log_path.read_text()
    lines = [json.loads(raw) for raw in text.splitlines() if raw.strip()]  # every line parses
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    about = [line for line in lines if line.get("message_id") == msg_id]
    assert all(line["topic"] == "logs.json" and line["trace_id"] == trace_id for line in about)
    handled = [line for line in about if line["message"] == "handling order 42"]
    assert len(handled) == 2, text[-3000:]  # the handler's own lines, on both attempts
    assert any(line["level"] == "WARNING" and "fails once" in line["message"] for line in about)

    [send] = [s for s in exporter().get_finished_spans() if s.name == "send logs.json"]
    spans = [json.loads(raw) for raw in spans_file.read_text().splitlines()]
    runs = sorted((s for s in spans if s["name"] == "process logs.json"), key=lambda s: s["attempt"])
    assert [s["attempt"] for s in runs] == [1, 2]
    assert all(s["trace_id"] == trace_id and s["parent_id"] == format(send.context.span_id, "016x") for s in runs)
