"""A worker module for the JSON-log test: its handler logs a line and fails on the first attempt.

With $SPANS_FILE set it also installs OpenTelemetry's SDK, writing each finished span as one
JSON line there, so the test can see the worker process's spans."""

from __future__ import annotations

import json
import logging
import os

from tidemq import Message, MessageType, mq_consumer

log = logging.getLogger("handlers_logs")
_seen: set[int] = set()

if os.environ.get("SPANS_FILE"):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class _FileExporter(SpanExporter):
        def export(self, spans):
            with open(os.environ["SPANS_FILE"], "a", encoding="utf-8") as fh:
                for span in spans:
                    fh.write(json.dumps({
                        "name": span.name, "trace_id": format(span.context.trace_id, "032x"),
                        "span_id": format(span.context.span_id, "016x"),
                        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                        "attempt": span.attributes.get("tidemq.message.attempt")}) + "\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_FileExporter()))
    trace.set_tracer_provider(provider)


@mq_consumer("logs.json", type=MessageType.QUEUE, threads=1, ttr=30, batch=1)
def handle(message: Message) -> None:
    log.info("handling order %s", message.data["order"])
    if message.id not in _seen:
        _seen.add(message.id)
        raise RuntimeError("fails once")
