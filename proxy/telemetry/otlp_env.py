"""Where one OTLP signal goes, from the standard `OTEL_EXPORTER_OTLP_*` variables (pure).

Shared by the span exporter (`spans.py`) and the metrics exporters (`metric_pipeline.py`: the
endpoint and protocol), so both signals read the variables the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = [
    "ExportSettings",
    "export_settings",
    "otlp_target",
    "resource_attributes",
    "shown_endpoint",
    "span_destination",
    "traces_exporter",
]

DEFAULT_TIMEOUT = 10.0  # seconds, the Python SDK's default for OTEL_EXPORTER_OTLP_TIMEOUT


def resource_attributes(env: Mapping[str, str], version: str) -> dict[str, str]:
    """The resource's attributes from `env` (spans and metrics alike), as the SDK's own rules rank
    them: `telemetry.sdk.*` (who encoded them: taotrace's own pipeline), those of
    `OTEL_RESOURCE_ATTRIBUTES` (`k=v,k2=v2`, percent-encoded), then `OTEL_SERVICE_NAME` over their
    `service.name`; `taotrace` when neither names the service."""
    attributes: dict[str, str] = {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "taotrace",
        "telemetry.sdk.version": version,
    }
    for pair in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = unquote(value.strip())
    service = env.get("OTEL_SERVICE_NAME", "").strip()
    if service:
        attributes["service.name"] = service
    attributes.setdefault("service.name", "taotrace")
    attributes["service.version"] = version
    return attributes


def traces_exporter(env: Mapping[str, str]) -> str:
    """`OTEL_TRACES_EXPORTER`'s first entry (`otlp` by default, as the SDK's)."""
    return env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower()


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


def shown_endpoint(endpoint: str) -> str:
    """An endpoint fit to print: no user:password, no query string (it may carry a token)."""
    text = endpoint.strip()
    if "://" not in text:  # gRPC's bare `host:port`
        return text.rsplit("@", 1)[-1].split("?", 1)[0].split("#", 1)[0]
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(an endpoint that is not a URL)"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{'' if port is None else f':{port}'}{parts.path}"


def span_destination(env: Mapping[str, str]) -> str:
    """Where spans go, in words, as `tracing.build_tracing` resolves it from `env`."""
    kind = traces_exporter(env)
    if kind == "none":
        return "spans not exported (OTEL_TRACES_EXPORTER=none)"
    if kind == "console":
        return "spans printed to stdout (OTEL_TRACES_EXPORTER=console)"
    target = otlp_target(env, "traces")
    if target is None:
        return "spans not exported (set OTEL_EXPORTER_OTLP_ENDPOINT)"
    protocol, endpoint = target
    return f"spans to {shown_endpoint(endpoint)} (OTLP {'grpc' if protocol == 'grpc' else 'http/protobuf'})"


@dataclass(frozen=True)
class ExportSettings:
    """How one signal is sent over OTLP, from the standard variables (headers hold secrets: never print them)."""

    protocol: str  # "grpc" or "http/protobuf"
    endpoint: str
    headers: tuple[tuple[str, str], ...]
    timeout: float  # seconds for one export, retries included
    gzip: bool
    certificate: str | None  # a CA bundle to trust instead of the system's
    client_certificate: str | None
    client_key: str | None
    insecure: bool  # gRPC: plaintext (an http:// endpoint, or OTEL_EXPORTER_OTLP_INSECURE=true)


def _headers(text: str) -> tuple[tuple[str, str], ...]:
    """`k=v,k2=v2`, percent-encoded (the W3C baggage format the spec names); keys lower-cased."""
    out = []
    for pair in text.split(","):
        key, sep, value = pair.partition("=")
        key = unquote(key).strip().lower()
        if sep and key:
            out.append((key, unquote(value).strip()))
    return tuple(out)


def _timeout(text: str | None) -> float:
    """Seconds, as the Python SDK reads OTEL_EXPORTER_OTLP_TIMEOUT; the default when absent or wrong."""
    try:
        value = float(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if 0 < value < float("inf") else DEFAULT_TIMEOUT


def export_settings(env: Mapping[str, str], signal: str) -> ExportSettings | None:
    """The settings for `signal` ("traces" or "metrics"); None when no endpoint is set.

    For each variable the signal's own (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`) wins over the generic one.
    """
    target = otlp_target(env, signal)
    if target is None:
        return None
    protocol, endpoint = target
    upper = signal.upper()

    def read(name: str) -> str | None:
        return env.get(f"OTEL_EXPORTER_OTLP_{upper}_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}") or None

    scheme = endpoint.split("://", 1)[0].lower() if "://" in endpoint else ""
    insecure = scheme == "http" or (not scheme and (read("INSECURE") or "").strip().lower() == "true")
    return ExportSettings(
        protocol="grpc" if protocol == "grpc" else "http/protobuf",
        endpoint=endpoint,
        headers=_headers(read("HEADERS") or ""),
        timeout=_timeout(read("TIMEOUT")),
        gzip=(read("COMPRESSION") or "").strip().lower() == "gzip",
        certificate=read("CERTIFICATE"),
        client_certificate=read("CLIENT_CERTIFICATE"),
        client_key=read("CLIENT_KEY"),
        insecure=insecure,
    )
