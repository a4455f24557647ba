"""OpenTelemetry's SDK for tests: one in-memory exporter for the whole test process.

A process has one global tracer provider, set once; every test that looks at spans shares this
exporter and clears it first (``spans()``).
"""

from __future__ import annotations

import threading

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_lock = threading.Lock()
_exporter: InMemorySpanExporter | None = None


def exporter() -> InMemorySpanExporter:
    """The process's in-memory exporter, installed with an SDK tracer provider on first use."""
    global _exporter
    with _lock:
        if _exporter is None:
            _exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(_exporter))
            trace.set_tracer_provider(provider)
        return _exporter


def hex_trace(span) -> str:
    """A finished span's trace id as 32 hex characters."""
    return format(span.context.trace_id, "032x")
