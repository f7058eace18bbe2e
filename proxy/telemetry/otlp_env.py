"""Where one OTLP signal goes, from the standard `OTEL_EXPORTER_OTLP_*` variables, and the
`OTEL_TRACES_EXPORTER` list and `OTEL_SDK_DISABLED` (pure).

Shared by the span exporters (`tracing.py`) and the metrics exporters (`metric_pipeline.py`: the
endpoint and protocol), so both signals read the variables the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = [
    "COMPRESSIONS",
    "OWN_OTLP",
    "PROTOCOLS",
    "ExportSettings",
    "export_settings",
    "exporter_names",
    "otlp_target",
    "sdk_disabled",
    "shown_endpoint",
    "span_destination",
]

DEFAULT_TIMEOUT = 10.0  # seconds, the Python SDK's default for OTEL_EXPORTER_OTLP_TIMEOUT
PROTOCOLS = ("grpc", "http/protobuf")  # what our OTLP exporters send (http/json: neither do the SDK's)
COMPRESSIONS = ("gzip", "deflate", "none")  # OTEL_EXPORTER_OTLP_COMPRESSION, as the SDK's exporters take it
# The exporter names our own OTLP exporter answers to, and the protocol each one fixes (None: the
# OTEL_EXPORTER_OTLP_*PROTOCOL variables say). The two long names are the OTLP exporter
# package's own entry points; the SDK maps `otlp` to one of them by the protocol.
OWN_OTLP: dict[str, str | None] = {"otlp": None, "otlp_proto_grpc": "grpc", "otlp_proto_http": "http/protobuf"}


def sdk_disabled(env: Mapping[str, str]) -> bool:
    """`OTEL_SDK_DISABLED=true` (case-insensitive, as the specification reads booleans): no span
    and no metric is exported, and the proxy starts no span (the caller's trace headers go
    upstream untouched)."""
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def exporter_names(
    env: Mapping[str, str], variable: str = "OTEL_TRACES_EXPORTER", default: str = "otlp"
) -> tuple[str, ...]:
    """The exporters a comma list names, in order, each once (`otlp` for spans by default, as
    the SDK's); `none` (alone) is none. `otlp`, `none` and `console` are read in any case; any
    other name is an entry point's, whose case matters. Raises ValueError for `none` among others."""
    names: list[str] = []
    for part in env.get(variable, default).split(","):
        name = part.strip()
        if name.lower() in (*OWN_OTLP, "none", "console"):
            name = name.lower()
        if name and name not in names:
            names.append(name)
    if "none" in names:
        if len(names) > 1:
            raise ValueError(f"{variable} lists none with other exporters: name the exporters, or none alone")
        return ()
    return tuple(names)


def otlp_target(env: Mapping[str, str], signal: str, protocol: str | None = None) -> tuple[str, str] | None:
    """(protocol, endpoint) for `signal` ("traces" or "metrics"); None when no endpoint is set.

    The signal's own variables win over the generic ones; `protocol`, when given, over both (an
    exporter named `otlp_proto_grpc` or `otlp_proto_http`). Per the spec, over HTTP the generic
    endpoint gets `/v1/<signal>` appended while the signal's own endpoint is used as is; gRPC
    takes either as is. The protocol is returned as set: `export_settings` refuses what we do not send.
    """
    upper = signal.upper()
    specific = env.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
    generic = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not (specific or generic):
        return None  # no endpoint: no network export is attempted
    protocol = (
        (
            protocol
            or env.get(f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL")
            or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        )
        .strip()
        .lower()
    )
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
    """Where spans go, in words, for every exporter `OTEL_TRACES_EXPORTER` lists, as
    `tracing.build_tracing` resolves them from `env` (a list it would refuse is not described)."""
    if sdk_disabled(env):
        return "spans not exported (OTEL_SDK_DISABLED=true)"
    try:
        names = exporter_names(env)
    except ValueError:
        names = ()
    if not names:
        return "spans not exported (OTEL_TRACES_EXPORTER=none)"
    going, missing = [], False
    for name in names:
        if name in OWN_OTLP:
            target = otlp_target(env, "traces", OWN_OTLP[name])
            if target is None:
                missing = True
            else:
                protocol, endpoint = target
                going.append(f"to {shown_endpoint(endpoint)} (OTLP {protocol})")
        elif name == "console":
            going.append("printed to stdout (OTEL_TRACES_EXPORTER=console)")
        else:
            going.append(f"through the {name} exporter (OTEL_TRACES_EXPORTER={name}, its own settings)")
    if not going:
        return "spans not exported (set OTEL_EXPORTER_OTLP_ENDPOINT)"
    unsent = "; not over OTLP (set OTEL_EXPORTER_OTLP_ENDPOINT)" if missing else ""
    return f"spans {' and '.join(going)}{unsent}"


@dataclass(frozen=True)
class ExportSettings:
    """How one signal is sent over OTLP, from the standard variables (headers hold secrets: never print them)."""

    protocol: str  # "grpc" or "http/protobuf"
    endpoint: str
    headers: tuple[tuple[str, str], ...]
    timeout: float  # seconds for one export, retries included
    compression: str  # "gzip", "deflate" or "" (none)
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


def export_settings(env: Mapping[str, str], signal: str, protocol: str | None = None) -> ExportSettings | None:
    """The settings for `signal` ("traces" or "metrics"); None when no endpoint is set.

    For each variable the signal's own (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`) wins over the generic
    one; `protocol`, when given, over both. Raises ValueError for a protocol or a compression we
    do not send (never silently another).
    """
    target = otlp_target(env, signal, protocol)
    if target is None:
        return None
    protocol, endpoint = target
    upper = signal.upper()

    def read(name: str) -> str | None:
        return env.get(f"OTEL_EXPORTER_OTLP_{upper}_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}") or None

    if protocol not in PROTOCOLS:
        raise ValueError(f"OTLP protocol {protocol[:32]!r} is not supported: use {' or '.join(PROTOCOLS)}")
    compression = (read("COMPRESSION") or "none").strip().lower()
    if compression not in COMPRESSIONS:
        raise ValueError(f"OTLP compression {compression[:32]!r} is not supported: use {', '.join(COMPRESSIONS)}")
    scheme = endpoint.split("://", 1)[0].lower() if "://" in endpoint else ""
    insecure = scheme == "http" or (not scheme and (read("INSECURE") or "").strip().lower() == "true")
    return ExportSettings(
        protocol=protocol,
        endpoint=endpoint,
        headers=_headers(read("HEADERS") or ""),
        timeout=_timeout(read("TIMEOUT")),
        compression="" if compression == "none" else compression,
        certificate=read("CERTIFICATE"),
        client_certificate=read("CLIENT_CERTIFICATE"),
        client_key=read("CLIENT_KEY"),
        insecure=insecure,
    )
