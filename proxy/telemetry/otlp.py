"""The OTLP/protobuf encoding of our finished spans (`spandata.SpanData`), written byte by byte.

`encode_spans` returns the serialised `ExportTraceServiceRequest` that
`opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans(spans).SerializePartialToString()`
returns for the same spans as the SDK's `ReadableSpan` (same fields, same order, same grouping by
resource then scope; tests/test_telemetry_otlp.py holds it to that), without building and copying
nested upb messages. It differs from the library in two places, both on purpose:

- a link's `trace_state` is sent (the OTLP field exists; the library leaves it out);
- an attribute OTLP cannot carry (an int beyond int64, an unknown type, a string that is not
  valid UTF-8) is skipped and counted in the message's `dropped_attributes_count`, where the
  library skips it and logs a traceback. `encode_spans` never raises for an attribute.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode, TraceState

from proxy.telemetry.spandata import UNSET, SpanData

__all__ = ["PAUSE_EVERY", "encode_spans", "release_gil"]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# Span.flags (field 16) and Link.flags (field 6), fixed32: HAS_IS_REMOTE, | IS_REMOTE when remote.
_LOCAL, _REMOTE = (0x100).to_bytes(4, "little"), (0x300).to_bytes(4, "little")
_SPAN_FLAGS = {False: b"\x85\x01" + _LOCAL, True: b"\x85\x01" + _REMOTE}
_LINK_FLAGS = {False: b"\x35" + _LOCAL, True: b"\x35" + _REMOTE}
_pack_d = struct.Struct("<d").pack
_pack_q = struct.Struct("<Q").pack


# Encoding runs in the batch processor's thread, in pure Python: a batch held the GIL for a burst.
# The event loop gives the GIL up on every epoll_wait, and CPython's forced switch (the switch
# interval) did not hand it back promptly: a wake-up during a burst waited for most of it. So the
# encoder gives it up every few spans; each release costs a system call, so not after every one
# (the count: docs/performance.md).
PAUSE_EVERY = 16


def release_gil() -> None:
    """Give the GIL up for a moment (time.sleep(0) releases it and lets a waiting thread run)."""
    time.sleep(0)


class _Unencodable(Exception):
    """An attribute value OTLP cannot carry: the attribute is skipped and counted."""


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
    """An AnyValue message body, as the library's _encode_value builds it (its isinstance order)."""
    t = type(value)
    if t is str:
        b: bytes = value.encode()
        return b"\x0a" + _len(len(b)) + b
    if t is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if t is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _Unencodable
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if t is float:
        return b"\x21" + _pack_d(value)
    if t is tuple or t is list:
        body = b"".join([b"\x0a" + _len(len(v)) + v for v in map(_any_value, value)])
        return b"\x2a" + _len(len(body)) + body
    return _other_value(value)


def _other_value(value: Any) -> bytes:
    """The rare shapes: None, subclasses (str and int enums), bytes, other sequences, mappings."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _any_value(str(value))
    if isinstance(value, int):
        return _any_value(int(value))
    if isinstance(value, float):
        return _any_value(float(value))
    if isinstance(value, bytes):
        raw = bytes(value)
        return b"\x3a" + _len(len(raw)) + raw
    if isinstance(value, Sequence):
        return _any_value(tuple(value))
    if isinstance(value, Mapping):
        body = b"".join([b"\x0a" + _len(len(kv)) + kv for kv in (_key_value(str(k), v) for k, v in value.items())])
        return b"\x32" + _len(len(body)) + body
    raise _Unencodable


def _key_value(key: Any, value: Any) -> bytes:
    """A KeyValue body. An empty key is absent on the wire (proto3); the value always present."""
    if type(key) is not str and not isinstance(key, str):
        raise _Unencodable
    k = key.encode()
    v = _any_value(value)
    return (b"\x0a" + _len(len(k)) + k if k else b"") + b"\x12" + _len(len(v)) + v


# Framed KeyValues whose value repeats (model, provider, server address, status code, token counts):
# field -> key -> (the value type, value -> bytes). Keyed by the value within its key and type, not by
# a tuple built per attribute. A key's values of one type are cached (its values have one type in
# practice: another type takes the slot); a key whose values never repeat (a response id) churns its
# own slot only, cleared when full.
_KV_CACHES: dict[bytes, dict[str, tuple[type, dict[Any, bytes]]]] = {}
_VALUES_PER_KEY = 1024
_KEYS_MAX = 4096
_KEY_FIELDS: dict[str, bytes] = {}  # attribute key -> its KeyValue.key field (keys come from a small set)
_FLOAT_VALUE = b"\x12\x09\x21"  # KeyValue.value: an AnyValue of 9 bytes holding a double


def _key_field(key: str) -> bytes:
    """KeyValue.key (absent when empty, as proto3 writes it), from a cache. Raises UnicodeError."""
    k = key.encode()
    field = b"\x0a" + _len(len(k)) + k if k else b""
    if len(_KEY_FIELDS) >= _KEYS_MAX:
        _KEY_FIELDS.clear()
    _KEY_FIELDS[key] = field
    return field


def _attributes(attributes: Mapping[Any, Any], field: bytes) -> bytes:
    """Each attribute as a length-delimited KeyValue in `field`; repeated values come from a cache.

    Raises _Unencodable if any attribute cannot be carried (the caller then takes the slow path)."""
    out = []
    keys = _KV_CACHES.get(field)
    if keys is None:
        keys = _KV_CACHES[field] = {}
    for key, value in attributes.items():
        t = type(value)
        # A slot holds values of one cacheable type; looked up before anything else (most
        # attributes hit). A tuple is looked up only when all strings (hashable, and encoded as
        # any equal tuple is).
        entry = keys.get(key)
        if entry is not None and entry[0] is t and (t is not tuple or all([type(v) is str for v in value])):
            hit = entry[1].get(value)
            if hit is not None:
                out.append(hit)
                continue
        if t is float and type(key) is str:  # a duration or a cost: rarely the same twice, never cached
            try:
                kf = _KEY_FIELDS.get(key) or _key_field(key)
            except UnicodeError as error:
                raise _Unencodable from error
            out.append(field + _len(len(kf) + 11) + kf + _FLOAT_VALUE + _pack_d(value))
            continue
        # Only values whose equal ones encode the same: not floats (0.0 == -0.0), not mixed
        # tuples ((1,) == (True,)); finish reasons, mostly ("stop",), are all strings.
        cacheable = t is str or t is bool or t is int or (t is tuple and all([type(v) is str for v in value]))
        try:
            kv = _key_value(key, value)
        except (_Unencodable, UnicodeError, RecursionError) as error:
            raise _Unencodable from error
        kv = field + _len(len(kv)) + kv
        if cacheable and len(kv) < 256 and type(key) is str:
            if entry is None or entry[0] is not t:
                if len(keys) >= _KEYS_MAX:
                    keys.clear()
                entry = keys[key] = (t, {})
            values = entry[1]
            if len(values) >= _VALUES_PER_KEY:
                values.clear()
            values[value] = kv
        out.append(kv)
    return b"".join(out)


def _attributes_skipping(attributes: Mapping[Any, Any], field: bytes) -> tuple[bytes, int]:
    """The attributes that can be carried, and how many could not (each skipped whole)."""
    out, dropped = [], 0
    for key, value in attributes.items():
        try:
            kv = _key_value(key, value)
        except (_Unencodable, UnicodeError, RecursionError):
            dropped += 1
            continue
        out.append(field + _len(len(kv)) + kv)
    return b"".join(out), dropped


def _attributes_counted(attributes: Mapping[Any, Any] | None, field: bytes) -> tuple[bytes, int]:
    if not attributes:
        return b"", 0
    try:
        return _attributes(attributes, field), 0
    except _Unencodable:
        return _attributes_skipping(attributes, field)


def _trace_state(state: TraceState | None) -> bytes:
    if not state:
        return b""
    # The library's ",".join of f"{k}={v}" over items(); to_header joins the same from the dict
    # underneath, without the Mapping protocol's Python-level calls per entry.
    s = state.to_header().encode()
    return b"\x1a" + _len(len(s)) + s


def _link(link: Any) -> bytes:
    ctx = link.context
    attributes, dropped = _attributes_counted(link.attributes, b"\x22")
    dropped += link.dropped_attributes
    body = b"".join(
        (
            b"\x0a\x10",
            ctx.trace_id.to_bytes(16, "big"),
            b"\x12\x08",
            ctx.span_id.to_bytes(8, "big"),
            _trace_state(ctx.trace_state),
            attributes,
            b"\x28" + _varint(dropped) if dropped else b"",
            _LINK_FLAGS[bool(ctx.is_remote)],
        )
    )
    return b"\x6a" + _len(len(body)) + body


# SpanKind's values (0-4) in order, each as Span.kind (field 6) with OTLP's number (value + 1);
# indexed by `_value_`: a dict keyed by the member would hash it in Python (Enum.__hash__).
_KIND_FIELD = tuple(b"\x30" + bytes((kind.value + 1,)) for kind in sorted(SpanKind, key=lambda k: k.value))
_pack_times = struct.Struct("<BQBQ").pack  # start (field 7) and end (field 8), both set on a finished span
_NO_STATUS = b"\x7a\x00"
_OK_STATUS = b"\x7a\x02\x18\x01"
_ERROR_STATUS = b"\x7a\x02\x18\x02"


class _Ids:
    """Encoded id fields within one batch: a request's spans share a trace id, its children the parent."""

    __slots__ = ("names", "parents", "states", "traces")

    def __init__(self) -> None:
        # id(trace state) -> its field: a request's spans share one object (and most the empty
        # one), whose truth alone is a Python-level __len__; the batch holds each object alive
        self.states: dict[int, bytes] = {}
        self.traces: dict[int, bytes] = {}  # trace id -> its field and the span id's tag
        self.parents: dict[int, bytes] = {}  # parent span id -> the parent_span_id field
        self.names: dict[str, bytes] = {}  # span name -> the name field (names repeat: a few per model)


def _status(status: Status) -> bytes:
    code, message = status.status_code, status.description
    if not message:
        if code is StatusCode.UNSET:
            return _NO_STATUS
        return _OK_STATUS if code is StatusCode.OK else _ERROR_STATUS
    m = message.encode()
    body = b"\x12" + _len(len(m)) + m
    if code is not StatusCode.UNSET:
        body += b"\x18" + _VARINTS[code.value]
    return b"\x7a" + _len(len(body)) + body


def _span(span: SpanData, ids: _Ids) -> list[bytes]:
    """The span's fields as pieces to join (the caller frames them: no copy of the whole here)."""
    trace_id, span_id, _, _, state, _ = span.context  # a tuple: unpacked without its properties
    head = ids.traces.get(trace_id)
    if head is None:
        head = ids.traces[trace_id] = b"\x0a\x10" + trace_id.to_bytes(16, "big") + b"\x12\x08"
    encoded_state = ids.states.get(id(state))
    if encoded_state is None:
        encoded_state = ids.states[id(state)] = _trace_state(state)
    parts = [head, span_id.to_bytes(8, "big"), encoded_state]
    parent = span.parent
    remote = False
    if parent is not None:
        parent_id, remote = parent[1], parent[2]
        field = ids.parents.get(parent_id)
        if field is None:
            field = ids.parents[parent_id] = b"\x22\x08" + parent_id.to_bytes(8, "big")
        parts.append(field)
    name = ids.names.get(span.name)
    if name is None:
        encoded = span.name.encode()
        name = ids.names[span.name] = b"\x2a" + _len(len(encoded)) + encoded if encoded else b""
    parts += (name, _KIND_FIELD[span.kind._value_])
    start, end = span.start_time, span.end_time
    if start and end:
        parts.append(_pack_times(0x39, start, 0x41, end))
    else:
        if start:
            parts += (b"\x39", _pack_q(start))
        if end:
            parts += (b"\x41", _pack_q(end))
    dropped = span.dropped_attributes
    attributes = span.attributes
    if attributes:
        try:
            parts.append(_attributes(attributes, b"\x4a"))
        except _Unencodable:
            encoded, skipped = _attributes_skipping(attributes, b"\x4a")
            parts.append(encoded)
            dropped += skipped
    if dropped:
        parts += (b"\x50", _varint(dropped))
    if span.links:
        parts += [_link(link) for link in span.links]
    status = span.status
    parts += (_NO_STATUS if status is UNSET else _status(status), _SPAN_FLAGS[bool(remote)])
    return parts


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
    attributes, dropped = _attributes_counted(resource.attributes, b"\x0a")
    return _message(b"\x0a", attributes + (b"\x10" + _varint(dropped) if dropped else b""))


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b"\x0a\x00"
    attributes, dropped = _attributes_counted(scope.attributes, b"\x1a")
    body = _string(b"\x0a", scope.name) + _string(b"\x12", scope.version) + attributes
    return _message(b"\x0a", body + (b"\x20" + _varint(dropped) if dropped else b""))


def _grouped(
    spans: Sequence[SpanData], pause: Callable[[], object] | None
) -> list[tuple[Any, list[tuple[Any, list[bytes]]]]]:
    """Each span encoded, grouped as the library does: by resource, then scope, by equality, in
    order of first appearance. Keyed by identity first: all of the proxy's spans share one resource
    and one scope object."""
    by_id: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    ids = _Ids()
    last: tuple[object, object] | None = None
    pieces: list[bytes] = []
    for i, span in enumerate(spans, 1):
        if pause is not None and i % PAUSE_EVERY == 0:
            pause()
        resource = span.resource
        scope = span.instrumentation_scope or None
        if last is None or last[0] is not resource or last[1] is not scope:  # the proxy's: one pair
            last = (resource, scope)
            r = by_id.get(id(resource))
            if r is None:
                r = by_id[id(resource)] = (resource, {})
            s = r[1].get(id(scope))
            if s is None:
                s = r[1][id(scope)] = (scope, [])
            pieces = s[1]  # framed as ScopeSpans.spans (field 2) here, all joined once at the end
        parts = _span(span, ids)
        pieces.append(b"\x12" + _len(sum(map(len, parts))))
        pieces += parts
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
    return groups


def encode_spans(spans: Sequence[SpanData], pause: Callable[[], object] | None = None) -> bytes:
    """The serialised ExportTraceServiceRequest for `spans`.

    `pause`, when given, is called every PAUSE_EVERY spans (the exporters pass `release_gil`).
    """
    out = []
    for group_resource, group_scopes in _grouped(spans, pause):
        body = [_head(group_resource, _resource)]
        for scope, encoded in group_scopes:
            ss = _head(scope, _scope) + b"".join(encoded)
            ss += _string(b"\x1a", scope.schema_url if scope else None)
            body.append(_message(b"\x12", ss))
        body.append(_string(b"\x1a", group_resource.schema_url))
        out.append(_message(b"\x0a", b"".join(body)))
    return b"".join(out)
