"""The OTLP endpoint rules both exporters share (OpenTelemetry's exporter configuration spec)."""

from __future__ import annotations

import os

import pytest

from proxy.telemetry.otlp_env import otlp_target


@pytest.mark.parametrize("signal", ["traces", "metrics"])
def test_endpoint_rules_per_signal(signal: str) -> None:
    up = signal.upper()
    assert otlp_target({}, signal) is None  # nothing set: no export
    generic = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}
    assert otlp_target(generic, signal) == ("http/protobuf", f"http://c:4318/v1/{signal}")
    own = {**generic, f"OTEL_EXPORTER_OTLP_{up}_ENDPOINT": "http://o:9/x"}
    assert otlp_target(own, signal) == ("http/protobuf", "http://o:9/x")  # used as is
    grpc = {**generic, "OTEL_EXPORTER_OTLP_PROTOCOL": "gRPC"}
    assert otlp_target(grpc, signal) == ("grpc", "http://c:4318/")  # gRPC: no path appended
    mixed = {**grpc, f"OTEL_EXPORTER_OTLP_{up}_PROTOCOL": "http/protobuf"}
    assert otlp_target(mixed, signal) == ("http/protobuf", f"http://c:4318/v1/{signal}")  # the signal's own wins


def test_the_resource_follows_the_sdks_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_RESOURCE_ATTRIBUTES (how a viewer's project or a deployment is named) reaches spans and
    metrics; OTEL_SERVICE_NAME wins over its service.name; `taotrace` when neither names one. Set
    in the process environment: the SDK's Resource.create() reads them there."""
    from proxy import __version__
    from proxy.telemetry.genai_metrics import build_meter_provider
    from proxy.telemetry.tracing import build_tracing

    grouped = {"OTEL_RESOURCE_ATTRIBUTES": "openinference.project.name=llm%20proxy, service.name=from-attrs"}
    for env, service in (
        ({}, "taotrace"),
        (grouped, "from-attrs"),
        ({**grouped, "OTEL_SERVICE_NAME": "from-name"}, "from-name"),
    ):
        for name in ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        meters = build_meter_provider({**os.environ, "OTEL_METRICS_EXPORTER": "console"})
        assert meters is not None
        assert meters.resource.attributes["service.version"] == __version__
        for attrs in (
            build_tracing(os.environ).resource.attributes,
            meters.resource.attributes,
        ):
            assert attrs["service.name"] == service
            assert attrs.get("openinference.project.name") == ("llm proxy" if env else None)
        meters.shutdown()
