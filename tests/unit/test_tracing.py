"""Trace context without a broker: the traceparent helpers, the handler span around each
attempt (StubBroker + Worker), and tidemq working with no OpenTelemetry installed at all."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from opentelemetry import trace

from tests.otel import exporter, hex_trace
from tidemq import MessageType, Worker, tracing
from tidemq.consumer import ConsumerSpec
from tidemq.coordinators.local import LocalCoordinator
from tidemq.stub import StubBroker

ROOT = Path(__file__).resolve().parents[2]


def test_traceparent_checks():
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert tracing.check_traceparent(good) == good
    assert tracing.check_traceparent("") == ""
    assert tracing.trace_id_of(good) == "0af7651916cd43dd8448eb211c80319c"
    assert tracing.trace_id_of("garbage") == ""
    for bad in ("00-xyz-b7ad6b7169203331-01", good.upper(), good + "\n", "00-" + "a" * 300):
        with pytest.raises(ValueError, match="W3C traceparent"):
            tracing.check_traceparent(bad)


def test_the_current_span_is_injected_and_none_outside_one():
    exporter().clear()
    assert tracing.current_traceparent() == ""
    with trace.get_tracer("test").start_as_current_span("parent") as span:
        context = tracing.current_traceparent()
        assert tracing.trace_id_of(context) == format(span.get_span_context().trace_id, "032x")
        assert tracing.current_trace_id() == tracing.trace_id_of(context)


def test_every_attempt_of_a_handler_is_a_child_of_the_producer_span():
    """A handler that fails once: both attempts' spans are children of the producing span, in
    its trace; the failed one carries the exception and status ERROR."""
    spans = exporter()
    spans.clear()
    stub = StubBroker()
    attempts = []
    done = threading.Event()

    def handler(message):
        attempts.append((message.attempt, tracing.current_trace_id()))
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")
        done.set()

    with trace.get_tracer("test").start_as_current_span("send") as producer:
        msg_id = stub.produce("traced", {"n": 1}, retry=[0], trace_context=tracing.current_traceparent())
    spec = ConsumerSpec("traced", MessageType.QUEUE, handler, threads=1, ttr=30, batch=1)
    coordinator = LocalCoordinator()
    coordinator.start()
    worker = Worker([spec], link=stub, coordinator=coordinator, instance="w1", drain_timeout=5).start()
    try:
        assert done.wait(10)
    finally:
        worker.stop()
        coordinator.stop()
    want = format(producer.get_span_context().trace_id, "032x")
    assert [trace_id for _, trace_id in attempts] == [want, want]
    handled = [s for s in spans.get_finished_spans() if s.name == "process traced"]
    assert len(handled) == 2
    for span in handled:
        assert hex_trace(span) == want and span.parent.span_id == producer.get_span_context().span_id
        assert span.kind is trace.SpanKind.CONSUMER
        assert span.attributes["messaging.system"] == "tidemq"
        assert span.attributes["messaging.destination.name"] == "traced"
        assert span.attributes["messaging.message.id"] == str(msg_id)
    first, second = sorted(handled, key=lambda s: s.attributes["tidemq.message.attempt"])
    assert first.status.status_code is trace.StatusCode.ERROR and first.events[0].name == "exception"
    assert second.status.status_code is trace.StatusCode.UNSET


_NO_OTEL = textwrap.dedent("""
    import sys, threading
    sys.modules["opentelemetry"] = None   # any import of it now raises ImportError
    import tidemq, logging, json
    from tidemq import MessageType, Worker, tracing
    from tidemq.consumer import ConsumerSpec
    from tidemq.coordinators.local import LocalCoordinator
    from tidemq.logs import JsonFormatter, message_context
    from tidemq.stub import StubBroker

    assert not tracing.available()
    assert tracing.current_traceparent() == "" and tracing.current_trace_id() == ""
    with tracing.produce_span("t", 1) as span:
        assert span is None
    tracing.record_lock("t", tracing.now_ns(), [1], [""])
    stub = StubBroker()
    done = threading.Event()
    stub.produce("plain", {"n": 1}, trace_context="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    spec = ConsumerSpec("plain", MessageType.QUEUE, lambda m: done.set(), threads=1, ttr=30, batch=1)
    coordinator = LocalCoordinator()
    coordinator.start()
    worker = Worker([spec], link=stub, coordinator=coordinator, instance="w1", drain_timeout=5).start()
    assert done.wait(10)
    worker.stop()
    coordinator.stop()
    record = logging.LogRecord("x", logging.INFO, "f.py", 1, "hello", (), None)
    with message_context(7, "plain", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"):
        line = json.loads(JsonFormatter().format(record))
    assert line["trace_id"] == "0af7651916cd43dd8448eb211c80319c" and line["message_id"] == 7
    assert "opentelemetry" not in [m.split(".")[0] for m, v in sys.modules.items() if v is not None]
    print("ok")
""")


_API_ONLY = textwrap.dedent("""
    from opentelemetry import trace
    from tidemq import tracing
    assert tracing.available()
    with tracing.produce_span("t", 1) as span:       # no tracer provider installed: no spans
        assert span is None and tracing.current_traceparent() == ""
    with tracing.handler_span("t", 1, 1, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01") as span:
        assert span is None
    print("ok")
""")


def test_without_a_tracer_provider_no_spans_are_made():
    result = subprocess.run([sys.executable, "-c", _API_ONLY], capture_output=True, text=True, timeout=60,
                            env={"PYTHONPATH": str(ROOT / "client"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


_LATE_PROVIDER = textwrap.dedent("""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from tidemq import tracing
    with tracing.produce_span("t", 1) as span:       # none installed yet
        assert span is None
    trace.set_tracer_provider(TracerProvider())
    with tracing.produce_span("t", 1) as span:       # installed since: seen at once
        assert span is not None and tracing.current_traceparent() != ""
    print("ok")
""")

_ENV_PROVIDER = textwrap.dedent("""
    from tidemq import tracing
    with tracing.produce_span("t", 1) as span:       # named by OTEL_PYTHON_TRACER_PROVIDER
        assert span is not None and tracing.current_traceparent() != ""
    print("ok")
""")


@pytest.mark.parametrize("script, extra_env", [(_LATE_PROVIDER, {}),
                                               (_ENV_PROVIDER, {"OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"})],
                         ids=["set-after-first-span", "named-in-environment"])
def test_a_tracer_provider_is_seen_however_and_whenever_it_is_installed(script, extra_env):
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env={"PYTHONPATH": str(ROOT / "client"), "PATH": "/usr/bin:/bin", **extra_env})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_tidemq_works_without_opentelemetry():
    """In a process where `import opentelemetry` fails, produce-side helpers are no-ops and a
    worker runs a message that carries a trace context."""
    env_path = ":".join(str(ROOT / part) for part in ("client", "broker", "cli", "examples", ""))
    result = subprocess.run([sys.executable, "-c", _NO_OTEL], capture_output=True, text=True, timeout=60,
                            env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"
