"""Span export for tidemq's own processes, from OpenTelemetry's standard ``OTEL_*`` variables.

``tidemq broker``, ``tidemq worker`` and ``manage.py tidemq_worker`` call :func:`configure` at
start: with the ``otel`` extra installed and an exporter asked for (``Settings.otel_exporters``:
``OTEL_TRACES_EXPORTER``, or an ``OTEL_EXPORTER_OTLP_*ENDPOINT``), it installs an SDK tracer
provider whose spans go to that exporter in batches. The SDK itself reads the remaining
variables, so they mean what they mean for any OpenTelemetry program: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (the process's resource; tidemq only supplies a default service
name), ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``, the exporter's endpoint, headers,
certificate and timeout, and ``OTEL_BSP_*`` (the batch processor).

Nothing asked for, or a provider already installed (by the worker's modules, or by
``opentelemetry-instrument``), leaves tracing as it was. Applications that use tidemq as a
library configure OpenTelemetry themselves; this module is for the processes tidemq starts.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Optional

from .config import Settings
from .errors import ConfigurationError

__all__ = ["configure", "build_provider", "shutdown", "EXPORTERS", "PROTOCOLS"]

log = logging.getLogger(__name__)

EXPORTERS = ("otlp", "console")
PROTOCOLS = {"grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
             "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter"}


def configure(settings: Settings, service_name: str) -> Optional[Any]:
    """Install a tracer provider exporting to ``settings.otel_exporters``; return it (for
    :func:`shutdown`), or None when nothing was installed: no exporter asked for, the extra
    missing (a warning: tidemq runs on without spans, as it does without the extra), or a
    provider already installed (kept).
    """
    provider = build_provider(settings, service_name)
    if provider is None:
        return None
    trace = importlib.import_module("opentelemetry.trace")
    if not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        log.info("a tracer provider is already installed; the OTEL_* exporter settings are left to it")
        provider.shutdown()
        return None
    trace.set_tracer_provider(provider)
    log.info("exporting spans as %s with %s", provider.resource.attributes.get("service.name"),
             ", ".join(settings.otel_exporters))
    return provider


def build_provider(settings: Settings, service_name: str) -> Optional[Any]:
    """An SDK tracer provider exporting to ``settings.otel_exporters`` in batches (not installed),
    or None when none is asked for or the extra is missing.

    ``service_name`` is the resource's ``service.name`` unless ``OTEL_SERVICE_NAME`` (or
    ``OTEL_RESOURCE_ATTRIBUTES``) names one. An unknown exporter or protocol is a
    ConfigurationError naming the variable.
    """
    if not settings.otel_exporters:
        return None
    unknown = [name for name in settings.otel_exporters if name not in EXPORTERS]
    if unknown:
        raise ConfigurationError(f"OTEL_TRACES_EXPORTER: tidemq's processes export spans with "
                                 f"{', '.join(EXPORTERS)} (a comma list) or none, not {unknown[0]!r}")
    if "otlp" in settings.otel_exporters and settings.otel_protocol not in PROTOCOLS:
        raise ConfigurationError(f"OTEL_EXPORTER_OTLP_PROTOCOL: tidemq's processes speak {' or '.join(PROTOCOLS)}, "
                                 f"not {settings.otel_protocol!r}")
    try:
        sdk_trace = importlib.import_module("opentelemetry.sdk.trace")
        export = importlib.import_module("opentelemetry.sdk.trace.export")
        resources = importlib.import_module("opentelemetry.sdk.resources")
        exporters = [_exporter(name, settings.otel_protocol, export) for name in settings.otel_exporters]
    except ImportError as exc:
        log.warning("OTEL_* variables ask for span export, but %s is not installed: running without spans "
                    "(pip install 'tidemq[otel]')", exc.name)
        return None
    resource = resources.Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(resources.Resource({"service.name": service_name}))
    provider = sdk_trace.TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER
    for exporter in exporters:
        provider.add_span_processor(export.BatchSpanProcessor(exporter))
    return provider


def _exporter(name: str, protocol: str, export: Any) -> Any:
    if name == "console":
        return export.ConsoleSpanExporter()
    return importlib.import_module(PROTOCOLS[protocol]).OTLPSpanExporter()


def shutdown(provider: Optional[Any]) -> None:
    """Send the spans still queued in ``provider`` and stop it (at the end of a command)."""
    if provider is not None:
        provider.shutdown()
