"""A faster OTLP/protobuf encoding of finished spans, for the proxy's span shapes.

`encode_spans` returns the serialised `ExportTraceServiceRequest` that
`opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans(spans).SerializePartialToString()`
returns (same fields, same order, same grouping by resource then scope), writing protobuf bytes
directly instead of building and copying nested upb messages. A batch it does not cover (events,
links, an attribute value that is a mapping or cannot be encoded) is handed to the library encoder,
so the output is always the library's.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import (
    encode_spans as _library_encode_spans,
)
from opentelemetry.trace import SpanKind

__all__ = ["encode_spans", "library_encode"]

_KIND = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_FLAGS_LOCAL_PARENT = b"\x85\x01" + (0x100).to_bytes(4, "little")  # field 16 fixed32: HAS_IS_REMOTE
_FLAGS_REMOTE_PARENT = b"\x85\x01" + (0x300).to_bytes(4, "little")  # ... | IS_REMOTE
_pack_d = struct.Struct("<d").pack
_pack_q = struct.Struct("<Q").pack


# Encoding runs in the batch processor's thread, in pure Python, ~6-12 us per span: a 200-span
# batch held the GIL for bursts of up to 4 ms. The event loop gives the GIL up on every
# epoll_wait, and CPython's forced switch (the switch interval) did not hand it back promptly:
# a wake-up during a burst waited for most of it. Releasing the GIL every 16 spans (~100-200 us):
# loop wake-ups over 500 us while 200-span batches were encoded fell from 9-13 % to 0.2-4 %.
PAUSE_EVERY = 16


def release_gil() -> None:
    """Give the GIL up for a moment (time.sleep(0) releases it and lets a waiting thread run)."""
    time.sleep(0)


class _Unsupported(Exception):
    """Something only the library encoder handles (or rejects, with its own logging)."""


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Small varints are most lengths: precomputed.
_VARINTS = [_varint(n) for n in range(16384)]


def _len(n: int) -> bytes:
    return _VARINTS[n] if n < 16384 else _varint(n)


def _any_value(value: Any) -> bytes:
    """An AnyValue message body, as _encode_value builds it."""
    if value is None:
        return b""
    t = type(value)
    if t is str:
        b: bytes = value.encode()
        return b"\x0a" + _len(len(b)) + b
    if t is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if t is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _Unsupported
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if t is float:
        return b"\x21" + _pack_d(value)
    if t is bytes:
        raw: bytes = value
        return b"\x3a" + _len(len(raw)) + raw
    if t is tuple or t is list:
        body = b"".join(b"\x0a" + _len(len(v)) + v for v in map(_any_value, value))
        return b"\x2a" + _len(len(body)) + body
    raise _Unsupported  # subclasses, mappings, other sequences: the library's rules


_KV_CACHE: dict[tuple[bytes, str, type, Any], bytes] = {}  # (field, key, value type, value) -> bytes
_KV_CACHE_MAX = 8192


def _attributes(attributes: Any, field: bytes) -> bytes:
    """Each attribute as a length-delimited KeyValue in `field`; repeated values come from a cache."""
    if not attributes:
        return b""
    out = []
    cache = _KV_CACHE
    for key, value in attributes.items():
        t = type(value)
        cacheable = t is str or t is bool or t is int
        if cacheable:
            hit = cache.get((field, key, t, value))
            if hit is not None:
                out.append(hit)
                continue
        if type(key) is not str:
            raise _Unsupported
        k = key.encode()
        v = _any_value(value)
        kv = b"\x0a" + _len(len(k)) + k + b"\x12" + _len(len(v)) + v
        kv = field + _len(len(kv)) + kv
        if cacheable and len(v) < 256:
            if len(cache) >= _KV_CACHE_MAX:
                cache.clear()
            cache[(field, key, t, value)] = kv
        out.append(kv)
    return b"".join(out)


def _span(span: Any) -> bytes:
    if span.events or span.links:
        raise _Unsupported
    ctx = span.context
    parent = span.parent
    parts = [
        b"\x0a\x10",
        ctx.trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        ctx.span_id.to_bytes(8, "big"),
    ]
    state = ctx.trace_state
    if state:
        s = ",".join([f"{k}={v}" for k, v in state.items()]).encode()
        parts += (b"\x1a", _len(len(s)), s)
    if parent:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    name = span.name.encode()
    if name:
        parts += (b"\x2a", _len(len(name)), name)
    parts += (b"\x30", _VARINTS[_KIND[span.kind]])
    start, end = span.start_time, span.end_time
    if start:
        parts += (b"\x39", _pack_q(start))
    if end:
        parts += (b"\x41", _pack_q(end))
    attributes = span.attributes
    if attributes:
        parts.append(_attributes(attributes, b"\x4a"))
        dropped = span.dropped_attributes
        if dropped:
            parts += (b"\x50", _varint(dropped))
    status = span.status
    code, message = status.status_code.value, status.description
    body = b""
    if message:
        m = message.encode()
        body = b"\x12" + _len(len(m)) + m
    if code:
        body += b"\x18" + _VARINTS[code]
    parts += (b"\x7a", _len(len(body)), body)
    parts.append(_FLAGS_REMOTE_PARENT if parent is not None and parent.is_remote else _FLAGS_LOCAL_PARENT)
    return b"".join(parts)


def _string(field: bytes, value: str | None) -> bytes:
    if not value:
        return b""
    b = value.encode()
    return field + _len(len(b)) + b


def _message(field: bytes, body: bytes) -> bytes:
    return field + _len(len(body)) + body


_encoded_heads: dict[int, tuple[object, bytes]] = {}  # id -> (resource or scope, encoded); small


def _head(obj: Any, encode: Callable[[Any], bytes]) -> bytes:
    """Resource / scope messages are the same batch after batch: encode each object once."""
    hit = _encoded_heads.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    if len(_encoded_heads) > 64:
        _encoded_heads.clear()
    encoded = encode(obj)
    _encoded_heads[id(obj)] = (obj, encoded)
    return encoded


def _resource(resource: Any) -> bytes:
    return _message(b"\x0a", _attributes(resource.attributes, b"\x0a"))


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b"\x0a\x00"
    body = _string(b"\x0a", scope.name) + _string(b"\x12", scope.version) + _attributes(scope.attributes, b"\x1a")
    return _message(b"\x0a", body)


def _fast(spans: Sequence[Any], pause: Callable[[], object] | None) -> bytes:
    # Group as the library does (resource, then scope, by equality, in order of first appearance),
    # keyed by identity first: all of the proxy's spans share one resource and one scope object.
    by_id: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for i, span in enumerate(spans, 1):
        if pause is not None and i % PAUSE_EVERY == 0:
            pause()
        resource = span.resource
        scope = span.instrumentation_scope or None
        r = by_id.get(id(resource))
        if r is None:
            r = by_id[id(resource)] = (resource, {})
        s = r[1].get(id(scope))
        if s is None:
            s = r[1][id(scope)] = (scope, [])
        s[1].append(_span(span))
    groups: list[tuple[Any, list[tuple[Any, list[bytes]]]]] = []
    for resource, scopes in by_id.values():
        # equal but distinct objects are one group, as in the library; the group found stays bound
        for known, known_scopes in groups:  # noqa: B007
            if known == resource:
                break
        else:
            known_scopes = []
            groups.append((resource, known_scopes))
        for scope, encoded in scopes.values():
            for other, other_encoded in known_scopes:
                if other == scope:
                    other_encoded.extend(encoded)
                    break
            else:
                known_scopes.append((scope, encoded))
    out = []
    for group_resource, group_scopes in groups:
        body = [_head(group_resource, _resource)]
        for scope, encoded in group_scopes:
            ss = _head(scope, _scope) + b"".join([b"\x12" + _len(len(e)) + e for e in encoded])
            ss += _string(b"\x1a", scope.schema_url if scope else None)
            body.append(_message(b"\x12", ss))
        body.append(_string(b"\x1a", group_resource.schema_url))
        out.append(_message(b"\x0a", b"".join(body)))
    return b"".join(out)


def library_encode(spans: Sequence[Any]) -> bytes:
    encoded: bytes = _library_encode_spans(spans).SerializePartialToString()
    return encoded


def encode_spans(spans: Sequence[Any], pause: Callable[[], object] | None = None) -> bytes:
    """The serialised ExportTraceServiceRequest for `spans`, as the library would produce it.

    `pause`, when given, is called every PAUSE_EVERY spans (the exporters pass `release_gil`).
    """
    try:
        return _fast(spans, pause)
    except Exception:  # noqa: BLE001 - anything unusual: the library's encoding (and its error handling)
        return library_encode(spans)
