"""``tidemq broker`` and ``tidemq worker`` export spans where the standard OTEL_* variables say:
real processes send to a real OTLP/gRPC receiver started by the test, each under its service
name, and the spans join the trace of the request that produced the message."""

from __future__ import annotations

import signal

from opentelemetry import trace

from tests.otel import exporter
from tests.otlp import OtlpReceiver
from tests.processes import TIDEMQ, process_env, start_broker_process, wait_registered
from tests.servers import wait_until
from tidemq import Client

TOPIC = "otel.orders"


def test_broker_and_worker_processes_export_their_spans_over_otlp(settings, spawn, tmp_path):
    spans = exporter()  # this process's provider (in memory): the producer's side of the trace
    spans.clear()
    with OtlpReceiver() as receiver:
        env = process_env(settings, E2E_LOG=str(tmp_path / "handled.log"), E2E_TOPIC=TOPIC,
                          OTEL_BSP_SCHEDULE_DELAY="100")
        # The broker: an endpoint alone turns export on; the service name is tidemq's default.
        broker, _ = start_broker_process(spawn, tmp_path, {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        # The worker: named exporter, traces-only endpoint, the operator's service name and attributes.
        worker = spawn("worker", [*TIDEMQ, "worker", "tests.integration.handlers_e2e", "--drain-timeout", "5"],
                       {**env, "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
                        "OTEL_SERVICE_NAME": "shop-worker", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test"})
        client = Client(settings)
        try:
            wait_registered(client.coordinator, TOPIC, 1, 30)
            with trace.get_tracer("shop").start_as_current_span("checkout") as checkout:
                msg_id = client.produce(TOPIC, {"order": 7})
            trace_id = format(checkout.get_span_context().trace_id, "032x")
            [send] = [s for s in spans.get_finished_spans() if s.name == f"send {TOPIC}"]
            send_id = format(send.context.span_id, "016x")

            def of_trace(name: str):
                return [s for s in receiver.spans() if s.trace_id == trace_id and s.name == name]

            wait_until(lambda: of_trace(f"process {TOPIC}") and of_trace("tidemq.v1.Broker/Produce")
                       and of_trace(f"lock {TOPIC}"), 30, 0.05, "the broker's and the worker's spans received")
            [rpc] = of_trace("tidemq.v1.Broker/Produce")
            [lock] = of_trace(f"lock {TOPIC}")
            [handled] = of_trace(f"process {TOPIC}")
            assert rpc.service == lock.service == "tidemq-broker"
            assert handled.service == "shop-worker"
            assert handled.resource["deployment.environment"] == "test"
            # One trace: the broker's RPC and the handler are children of the producer's span.
            assert rpc.parent_span_id == send_id and handled.parent_span_id == send_id
            assert handled.attributes["messaging.message.id"] == str(msg_id)
            assert handled.attributes["messaging.destination.name"] == TOPIC
            # The group commit runs inside the RPC span that flushed it.
            [commit] = [s for s in receiver.spans() if s.name == "tidemq group commit" and s.trace_id == trace_id]
            assert commit.parent_span_id == rpc.span_id and commit.service == "tidemq-broker"
        finally:
            client.close()
        for proc in (worker, broker):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, proc.log_path.read_text()[-2000:]
        assert "exporting spans as shop-worker with otlp" in worker.log_path.read_text()
