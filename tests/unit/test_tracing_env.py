"""Which spans tidemq's processes export, from OpenTelemetry's standard variables
(``Settings.otel_exporters``, ``tidemq.tracing_env``); the export itself to a real receiver is
tests/integration/test_otlp_export.py."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from tidemq import Settings, tracing_env
from tidemq.errors import ConfigurationError


@pytest.mark.parametrize("env, exporters", [
    ({}, ()),
    ({"OTEL_SERVICE_NAME": "x"}, ()),  # a name alone sends nothing anywhere
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, ("otlp",)),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, ("otlp",)),
    ({"OTEL_TRACES_EXPORTER": "console,otlp"}, ("console", "otlp")),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, ()),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, ()),
])
def test_the_variables_say_which_exporters(env, exporters):
    assert Settings.from_env(env).otel_exporters == exporters


def test_an_application_may_name_exporters_tidemq_does_not_know():
    # Only tidemq's own processes export through tracing_env: a library user's settings load.
    settings = Settings.from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ConfigurationError, match="OTEL_TRACES_EXPORTER.*'zipkin'"):
        tracing_env.build_provider(settings, "tidemq-worker")
    http_json = Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(ConfigurationError, match="OTEL_EXPORTER_OTLP_PROTOCOL.*http/json"):
        tracing_env.build_provider(http_json, "tidemq-worker")


def test_the_provider_takes_sampler_service_and_exporters_from_the_environment(monkeypatch):
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    settings = Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp,console"})
    provider = tracing_env.build_provider(settings, "tidemq-worker")
    try:
        assert provider.resource.attributes["service.name"] == "tidemq-worker"
        assert "TraceIdRatioBased{0.25}" in provider.sampler.get_description()
        processors = provider._active_span_processor._span_processors
        assert [type(p.span_exporter) for p in processors] == [OTLPSpanExporter, ConsoleSpanExporter]
    finally:
        provider.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "billing-worker")
    named = tracing_env.build_provider(settings, "tidemq-worker")
    try:
        assert named.resource.attributes["service.name"] == "billing-worker"
    finally:
        named.shutdown()


def test_nothing_asked_for_builds_nothing():
    assert tracing_env.build_provider(Settings.from_env({}), "tidemq-broker") is None
    assert tracing_env.configure(Settings.from_env({}), "tidemq-broker") is None
