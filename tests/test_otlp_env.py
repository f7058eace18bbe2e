"""The OTLP endpoint rules both exporters share (OpenTelemetry's exporter configuration spec)."""

from __future__ import annotations

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
