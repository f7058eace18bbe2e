"""Where one OTLP signal goes, from the standard `OTEL_EXPORTER_OTLP_*` variables (pure).

Shared by the span exporter (`spans.py`) and the metrics exporter (`genai_metrics.py`), so both
signals read the variables the same way.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["otlp_target"]


def otlp_target(env: Mapping[str, str], signal: str) -> tuple[str, str] | None:
    """(protocol, endpoint) for `signal` ("traces" or "metrics"); None when no endpoint is set.

    The signal's own variables win over the generic ones. Per the spec, over HTTP the generic
    endpoint gets `/v1/<signal>` appended while the signal's own endpoint is used as is; gRPC
    takes either as is.
    """
    upper = signal.upper()
    specific = env.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
    generic = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not (specific or generic):
        return None  # no endpoint: no network export is attempted
    protocol = (
        env.get(f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    ).lower()
    if protocol == "grpc":
        return protocol, specific or generic or ""
    return protocol, specific or f"{(generic or '').rstrip('/')}/v1/{signal}"
