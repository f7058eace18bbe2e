"""W3C Trace Context: the caller's `traceparent`/`tracestate` in, ours out (pure).

With the default propagators (`OTEL_PROPAGATORS` unset, or `tracecontext` with or without
`baggage`) the proxy reads and writes the two headers itself, per the W3C Trace Context
specification; any other propagator set (b3, jaeger, ...) goes through the OpenTelemetry API's
public `extract`/`inject`, which run the configured propagators.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

__all__ = ["format_traceparent", "is_w3c", "parse", "parse_traceparent"]

# version-traceid-parentid-flags; a later version may append fields after a '-' (W3C §3.2).
_TRACEPARENT = re.compile(r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?[ \t]*$")
_W3C_FIELDS = frozenset({"traceparent", "tracestate", "baggage"})


def is_w3c(propagator: TextMapPropagator) -> bool:
    """True when the propagator reads and writes only the W3C headers (tracecontext [+ baggage]),
    judged by its public `fields`: then the proxy may read and write them itself."""
    fields = set(propagator.fields)
    return "traceparent" in fields and fields <= _W3C_FIELDS


def parse_traceparent(value: str) -> tuple[int, int, int] | None:
    """(trace id, parent id, flags) of a valid header; None otherwise (the caller starts a new trace)."""
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    if version == "ff" or (version == "00" and rest):  # ff is forbidden; 00 has exactly 4 fields
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, int(flags_hex, 16)


def parse(carrier: Mapping[str, str]) -> SpanContext | None:
    """The caller's span context from its headers (remote), or None without a valid `traceparent`."""
    header = carrier.get("traceparent")
    if header is None:
        return None
    ids = parse_traceparent(header)
    if ids is None:
        return None
    trace_id, span_id, flags = ids
    state = carrier.get("tracestate")
    trace_state = TraceState.from_header([state]) if state else TraceState()
    return SpanContext(trace_id, span_id, True, TraceFlags(flags), trace_state)


_FLAGS_HEX = tuple(f"{flags:02x}" for flags in range(256))


def format_traceparent(context: SpanContext) -> str:
    """Our `traceparent` (version 00), for a valid context (ids within 128 and 64 bits). The
    ids as bytes in hex, cheaper than formatting the ints (it runs per request)."""
    flags = int(context.trace_flags)
    return (
        f"00-{context.trace_id.to_bytes(16, 'big').hex()}-{context.span_id.to_bytes(8, 'big').hex()}-"
        f"{_FLAGS_HEX[flags] if flags < 256 else format(flags, '02x')}"
    )
