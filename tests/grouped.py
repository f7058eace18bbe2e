"""What a test reads of a `--workers` group, as it reads one process: the spans each worker
exported (over OTLP to a real receiver, decoded back to `SpanData`) and the records its live
view shows (`/api/requests` and each `/api/requests/{id}`, built back into `RequestRecord`s).

Records come back as the live view gives them: the instants the page has no use for are
rebuilt from the row's monotonic first-token instant (`start` = first token − TTFT; the
reasoning runs from the `thinking` spans' offsets), and the series it does not show (`chunk_gaps`, `relay`) are empty; a request that named no model says
`unknown`, as the page does.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from typing import Any

import aiohttp
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from proxy.accounting.prices import Cost
from proxy.accounting.ratelimits import RateLimits
from proxy.exchange.record import RequestRecord
from proxy.exchange.timing import RequestTiming
from proxy.telemetry.spandata import Resource, Scope, SpanData

__all__ = ["exported_spans", "records_of"]

_REMOTE = 0x200  # Span.flags: the parent is remote (with HAS_IS_REMOTE, 0x100)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind is not None else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _context(trace_id: bytes, span_id: bytes, flags: int, state: str, remote: bool = False) -> SpanContext:
    trace_state = TraceState.from_header([state]) if state else TraceState()
    return SpanContext(
        int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big"), remote, TraceFlags(flags & 0xFF), trace_state
    )


def exported_spans(payloads: Sequence[bytes]) -> list[SpanData]:
    """The spans of OTLP/HTTP protobuf export bodies, as `SpanData`."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out: list[SpanData] = []
    for payload in payloads:
        req = ExportTraceServiceRequest()
        req.ParseFromString(payload)
        for rs in req.resource_spans:
            resource = Resource(_attributes(rs.resource.attributes), rs.schema_url)
            for ss in rs.scope_spans:
                scope = Scope(ss.scope.name, ss.scope.version or None, ss.schema_url or None)
                for s in ss.spans:
                    context = _context(s.trace_id, s.span_id, s.flags, s.trace_state)
                    parent = (
                        _context(s.trace_id, s.parent_span_id, s.flags, s.trace_state, bool(s.flags & _REMOTE))
                        if s.parent_span_id
                        else None
                    )
                    links = tuple(
                        Link(
                            _context(
                                link.trace_id, link.span_id, link.flags, link.trace_state, bool(link.flags & _REMOTE)
                            ),
                            _attributes(link.attributes),
                        )
                        for link in s.links
                    )
                    status = Status(StatusCode(s.status.code), s.status.message or None)
                    out.append(
                        SpanData(
                            s.name, context, parent, SpanKind(s.kind - 1), s.start_time_unix_nano,
                            s.end_time_unix_nano, _attributes(s.attributes), resource, scope, status, links, (),
                            s.dropped_attributes_count,
                        )
                    )  # fmt: skip
    return out


_TYPES = {"Cost": Cost, "RateLimits": RateLimits}  # annotations their modules import only for type checking


def _built(hint: Any, value: Any) -> Any:
    """`value` (JSON, as the live view writes it) as the type `hint` names."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        dataclass = [a for a in inner if dataclasses.is_dataclass(a)]
        return _built(dataclass[0], value) if dataclass and isinstance(value, dict) else value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint, localns=_TYPES)
        given = {f.name: _built(hints[f.name], value[f.name]) for f in dataclasses.fields(hint) if f.name in value}
        missing = {
            f.name: None
            for f in dataclasses.fields(hint)
            if f.name not in given and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        return hint(**given, **missing)
    if origin is tuple:
        if isinstance(value, dict):  # (name, value) pairs, which the live view writes as an object
            return tuple(value.items())
        return tuple(_built(args[0] if args else Any, v) for v in value)
    return value


def _record(row: dict[str, Any], detail: dict[str, Any]) -> RequestRecord:
    given = dict(detail["record"])
    timing: dict[str, Any] = dict(given.pop("timing"))
    first, last, ttft = row["first_token_monotonic"], row["last_token_monotonic"], timing.get("ttft")
    start = first - ttft if first is not None and ttft is not None else 0.0
    network = timing.get("network")
    timing.update(
        start=start,
        end=start + timing["duration"],
        sent=None if network is None else start + network,
        first_token=first,
        last_token=last,
        itl=tuple(detail["gaps"]["values"]),
        chunk_gaps=(),
        relay=(),
        # the streamed reasoning runs, from the `thinking` spans drawn as offsets from the start
        thinking_spans=tuple(
            start + s[edge]
            for s in detail["spans"]
            if s["name"] == "thinking" and not s["estimated"]
            for edge in ("start", "end")
        ),
    )
    given["timing"] = _built(RequestTiming, timing)
    hints = typing.get_type_hints(RequestRecord, localns=_TYPES)
    for name, value in list(given.items()):
        if name != "timing" and name in hints:
            given[name] = _built(hints[name], value)
    known = {f.name for f in dataclasses.fields(RequestRecord)}
    return RequestRecord(**{k: v for k, v in given.items() if k in known})


async def records_of(metrics_url: str, session: aiohttp.ClientSession) -> list[RequestRecord]:
    """Every request the group's live view keeps, oldest first, as records."""
    async with session.get(metrics_url + "/api/requests", params={"limit": "1"}) as r:
        assert r.status == 200, await r.text()
        capacity = (await r.json())["capacity"]
    async with session.get(metrics_url + "/api/requests", params={"limit": str(capacity)}) as r:
        rows = (await r.json())["requests"]
    out = []
    for row in reversed(rows):
        async with session.get(f"{metrics_url}/api/requests/{row['id']}") as r:
            assert r.status == 200, await r.text()
            out.append(_record(row, await r.json()))
    return out
