"""The span pipeline's processors and exporters (proxy/telemetry/span_pipeline.py,
batch_processor.py), with exporters faked at the edge: classes implementing the protocol."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence

from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from proxy.telemetry.span_pipeline import ConsoleSpanExporter, InMemorySpanExporter, SimpleSpanProcessor
from proxy.telemetry.spandata import Resource, Scope, SpanData

RESOURCE = Resource({"service.name": "taotrace"}, "https://opentelemetry.io/schemas/1.37.0")
SCOPE = Scope("taotrace", "1.2.3")
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736


def span(i: int = 0, **kw: object) -> SpanData:
    args: dict[str, object] = {
        "name": "chat gpt-4o-mini",
        "context": SpanContext(TRACE_ID, 0x1000 + i, False, TraceFlags(1)),
        "parent": None,
        "kind": SpanKind.CLIENT,
        "start_time": 1_700_000_000_123_456_789,
        "end_time": 1_700_000_001_000_000_001,
        "attributes": {"n": i},
        "resource": RESOURCE,
        "instrumentation_scope": SCOPE,
    }
    args.update(kw)
    return SpanData(**args)  # type: ignore[arg-type]


class Raising:
    """An exporter whose every call raises."""

    def __init__(self) -> None:
        self.shut = 0

    def export(self, spans: Sequence[SpanData]) -> bool:
        raise RuntimeError("collector exploded")

    def shutdown(self) -> None:
        self.shut += 1


def test_in_memory_keeps_clears_and_refuses_after_shutdown() -> None:
    exporter = InMemorySpanExporter()
    a, b = span(1), span(2)
    assert exporter.export([a]) and exporter.export([b])
    assert exporter.get_finished_spans() == (a, b)
    exporter.clear()
    assert exporter.get_finished_spans() == ()
    exporter.shutdown()
    assert exporter.export([a]) is False and exporter.get_finished_spans() == ()


def test_simple_processor_exports_each_span_at_once_and_stops_at_shutdown() -> None:
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    s = span()
    processor.on_end(s)
    assert exporter.get_finished_spans() == (s,)
    assert processor.force_flush(1.0) and processor.shutdown(1.0)
    processor.on_end(span(2))
    assert exporter.get_finished_spans() == (s,)


def test_simple_processor_never_raises() -> None:
    exporter = Raising()
    processor = SimpleSpanProcessor(exporter)
    processor.on_end(span())  # the RuntimeError is contained
    assert processor.shutdown(1.0) and processor.shutdown(1.0)
    assert exporter.shut == 1


def test_console_writes_one_json_object_per_span_per_line() -> None:
    out = io.StringIO()
    root = span(
        1,
        parent=SpanContext(TRACE_ID, 0xFEED, True, TraceFlags(1)),
        context=SpanContext(TRACE_ID, 0x1001, False, TraceFlags(1), TraceState([("ot", "th:8")])),
        attributes={"s": "é", "t": ("stop", "length"), "f": math.inf, "b": b"\x01\x02", "ok": True},
        status=Status(StatusCode.ERROR, "upstream_error"),
        links=(Link(SpanContext(0xAB, 7, True, TraceFlags(1)), {"k": 1}),),
    )
    child = span(2, name="decode", kind=SpanKind.INTERNAL, parent=root.context, attributes={})
    assert ConsoleSpanExporter(out).export([root, child])
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["name"] == "chat gpt-4o-mini" and first["kind"] == "CLIENT"
    assert (first["trace_id"], first["span_id"], first["parent_span_id"]) == (
        f"{TRACE_ID:032x}", f"{0x1001:016x}", f"{0xFEED:016x}"
    )  # fmt: skip
    assert first["parent_is_remote"] is True and first["trace_state"] == "ot=th:8"
    assert first["start_time"] == "2023-11-14T22:13:20.123456789Z"
    assert first["start_time_unix_nano"] == 1_700_000_000_123_456_789
    assert first["end_time"] == "2023-11-14T22:13:21.000000001Z"
    assert first["attributes"] == {"s": "é", "t": ["stop", "length"], "f": "inf", "b": "0102", "ok": True}
    assert first["status"] == {"code": "ERROR", "description": "upstream_error"}
    assert first["links"] == [
        {"trace_id": f"{0xAB:032x}", "span_id": f"{7:016x}", "trace_state": "", "is_remote": True,
         "attributes": {"k": 1}}
    ]  # fmt: skip
    assert first["resource"] == {"attributes": {"service.name": "taotrace"}, "schema_url": RESOURCE.schema_url}
    assert (second["name"], second["kind"], second["parent_span_id"]) == ("decode", "INTERNAL", first["span_id"])


def test_console_on_a_closed_stream_fails_without_raising() -> None:
    out = io.StringIO()
    out.close()
    assert ConsoleSpanExporter(out).export([span()]) is False
