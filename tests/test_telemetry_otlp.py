"""proxy.telemetry.otlp encodes our SpanData exactly as the OTLP library encodes the same spans as
SDK ReadableSpans (bytes, and decoded messages), except where it means to differ: a link's
trace_state is sent, and an attribute OTLP cannot carry is counted in dropped_attributes_count."""

from __future__ import annotations

import http.server
import itertools
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as library_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource as SdkResource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from proxy.telemetry import otlp
from proxy.telemetry.batch_processor import BatchSpanProcessor
from proxy.telemetry.span_exporter import OtlpSpanExporter
from proxy.telemetry.spandata import Resource, Scope, SpanData
from proxy.telemetry.tracing import build_tracing
from tests.otel_versions import ENCODER_WRITES_NONE, ENCODER_WRITES_SCOPE_FIELDS

RESOURCE = Resource(
    {"service.name": "taotrace", "service.version": "1.2.3", "host.cores": 2, "k8s.ok": True, "ratio": 0.5,
     "tags": ("a", "b")}
)  # fmt: skip
SCOPE = Scope("taotrace", "1.2.3", "https://opentelemetry.io/schemas/1.37.0")

ATTRIBUTE_VALUES: dict[str, Any] = {
    "str": "chat gpt-4o-mini",
    "empty-str": "",
    "unicode": "модель – 模型 🚀",
    "long": "x" * 70000,
    "true": True,
    "false": False,
    "zero": 0,
    "int": 443,
    "negative": -5,
    "int64-max": (1 << 63) - 1,
    "int64-min": -(1 << 63),
    "float": 0.123456789,
    "float-zero": 0.0,
    "float-neg-zero": -0.0,
    "inf": math.inf,
    "nan-free-neg": -1e300,
    "bytes": b"\x00\x01",
    "none": None,
    "str-list": ("stop", "length"),
    "str-list-as-list": ["stop"],
    "bool-list": (True, False),
    "int-list": (1, -2, 3),
    "float-list": (0.5, 1.5),
    "empty-list": (),
    "mapping": {"a": 1, "b": ("x",), 3: "int key"},
    "nested-list": (("a",), (1, 2)),
    "str-enum": StatusCode.OK.name,
    "int-subclass": TraceFlags(1),
}


def ctx(
    trace_id: int = 0x4BF92F3577B34DA6A3CE929D0E0E4736,
    span_id: int = 0x1001,
    remote: bool = False,
    state: TraceState | None = None,
) -> SpanContext:
    return SpanContext(trace_id, span_id, remote, TraceFlags(0x03), state)


def span(name: str = "chat gpt-4o-mini", **kw: Any) -> SpanData:
    args: dict[str, Any] = {
        "context": ctx(),
        "parent": None,
        "resource": RESOURCE,
        "attributes": {"http.request.method": "POST", "server.port": 443},
        "kind": SpanKind.CLIENT,
        "start_time": 1_700_000_000_000_000_000,
        "end_time": 1_700_000_001_300_000_000,
        "instrumentation_scope": SCOPE,
    }
    args.update(kw)
    return SpanData(name, **args)


def readable(s: SpanData | ReadableSpan) -> ReadableSpan:
    """The same span as the SDK's ReadableSpan, for the library encoder."""
    if isinstance(s, ReadableSpan):
        return s
    scope = s.instrumentation_scope
    return ReadableSpan(
        s.name,
        context=s.context,
        parent=s.parent,
        resource=SdkResource(dict(s.resource.attributes), s.resource.schema_url),
        attributes=s.attributes,
        kind=s.kind,
        status=s.status,
        start_time=s.start_time,
        end_time=s.end_time,
        links=s.links,
        instrumentation_scope=(
            InstrumentationScope(scope.name, scope.version, scope.schema_url, scope.attributes) if scope else None
        ),
    )


def library(spans: Sequence[SpanData | ReadableSpan], dropped: int = 0) -> ExportTraceServiceRequest:
    """The library's request for `spans`, with what we send on purpose and it does not: each link's
    trace_state, and `dropped` more attributes counted on each span. (A ReadableSpan counts the
    attributes its BoundedAttributes dropped; SpanData carries the count itself.) Before 1.31,
    also the scope's schema_url, which the encoder left out then."""
    if not ENCODER_WRITES_NONE and any(
        None in (attributes or {}).values()
        for s in spans
        for attributes in (s.attributes, *(link.attributes for link in s.links))
    ):
        pytest.skip(
            "the library's encoder before 1.43 drops an attribute whose value is None (ours sends it empty, as it does since)"
        )
    if not ENCODER_WRITES_SCOPE_FIELDS and any(
        s.instrumentation_scope and s.instrumentation_scope.attributes for s in spans
    ):
        pytest.skip("the library's encoder before 1.31 leaves out a scope's attributes")
    request = library_encode_spans([readable(s) for s in spans])
    ours = {(s.context.trace_id, s.context.span_id): s for s in spans}
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for pb in ss.spans:
                s = ours[int.from_bytes(pb.trace_id, "big"), int.from_bytes(pb.span_id, "big")]
                scope = s.instrumentation_scope
                if not ENCODER_WRITES_SCOPE_FIELDS and scope is not None and scope.schema_url:
                    ss.schema_url = scope.schema_url
                for link, pb_link in zip(s.links, pb.links, strict=True):
                    state = link.context.trace_state
                    if state:
                        pb_link.trace_state = ",".join(f"{k}={v}" for k, v in state.items())
                pb.dropped_attributes_count += dropped + (s.dropped_attributes if isinstance(s, SpanData) else 0)
    return request


def assert_same(spans: Sequence[SpanData], dropped: int = 0) -> bytes:
    expected = library(spans, dropped)
    for _ in range(2):  # the second time from the caches
        ours = otlp.encode_spans(spans)
        assert ExportTraceServiceRequest.FromString(ours) == expected
        assert ours == expected.SerializePartialToString()
    return ours


def numbered(spans: list[SpanData]) -> list[SpanData]:
    """Distinct span ids, so the library's request can be matched back to ours."""
    for i, s in enumerate(spans):
        s.context = ctx(span_id=0x1001 + i, state=s.context.trace_state, remote=s.context.is_remote)
    return spans


LINK_STATE = TraceState([("vendor", "abc"), ("v2", "1")])
OTHER_RESOURCES = [RESOURCE, Resource({"service.name": "other"}, "https://opentelemetry.io/schemas/1.21.0"),
                   Resource(dict(RESOURCE.attributes))]  # fmt: skip
OTHER_SCOPES = [SCOPE, Scope("other"), Scope("taotrace", "1.2.3", "https://opentelemetry.io/schemas/1.37.0"),
                Scope("s", None, "https://schema", {"k": "v", "n": 1})]  # fmt: skip

VARIANTS: dict[str, list[SpanData]] = {
    **{f"attr-{k}": [span(attributes={"a": 1, f"v.{k}": v, "z": "end"})] for k, v in ATTRIBUTE_VALUES.items()},
    "all-attributes": [span(attributes={f"v.{k}": v for k, v in ATTRIBUTE_VALUES.items()})],
    "no-attributes": [span(attributes={})],
    "empty-key": [span(attributes={"": "v", "k": ""})],
    "status-unset": [span(status=Status(StatusCode.UNSET))],
    "status-ok": [span(status=Status(StatusCode.OK))],
    "status-error": [span(status=Status(StatusCode.ERROR, "upstream_5xx"))],
    "status-error-no-description": [span(status=Status(StatusCode.ERROR))],
    "tracestate": [span(context=ctx(state=TraceState([("vendor", "abc"), ("other", "1")])))],
    "local-parent": [span(parent=ctx(span_id=0x2002), kind=SpanKind.INTERNAL)],
    "remote-parent": [span(parent=ctx(span_id=0x2002, remote=True, state=TraceState([("v", "1")])))],
    "kinds": numbered([span(kind=k) for k in SpanKind]),
    "empty-name": [span(name="")],
    "zero-times": [span(start_time=0, end_time=0)],
    "dropped-already": [span(dropped_attributes=3)],
    "dropped-no-attributes": [span(attributes={}, dropped_attributes=2)],
    "link": [span(links=(Link(ctx(trace_id=0xAB, span_id=7)),))],
    "links": [
        span(
            links=(
                Link(ctx(trace_id=0xAB, span_id=7, remote=True, state=LINK_STATE), {"k": 1, "s": ("a", "b")}),
                Link(ctx(span_id=8), {"taotrace.link": "retry", "f": 0.5, "b": False}),
                Link(ctx(span_id=9, remote=True)),
            )
        )
    ],
    "no-scope": [span(instrumentation_scope=None)],
    "scope-attributes": [span(instrumentation_scope=OTHER_SCOPES[3])],
    "resource-schema": [span(resource=OTHER_RESOURCES[1])],
    "empty-resource": [span(resource=Resource({}))],
    "resources-and-scopes": numbered(
        [span(resource=r, instrumentation_scope=s) for r, s in itertools.product(OTHER_RESOURCES, OTHER_SCOPES)]
    ),
    "empty-batch": [],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bytes_and_messages_equal_the_library(variant: str) -> None:
    assert_same(VARIANTS[variant])


def test_a_request_of_the_proxys_shape_decodes_field_by_field() -> None:
    """A root CLIENT span (remote parent, trace_state, a link) and its INTERNAL children."""
    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    root = span(
        context=ctx(span_id=0x10, state=TraceState([("ot", "th:8")])),
        parent=ctx(span_id=0x01, remote=True),
        attributes={"gen_ai.operation.name": "chat", "gen_ai.response.finish_reasons": ("stop",),
                    "gen_ai.request.stream": True, "taotrace.cost": 0.0012, "server.port": 443},
        status=Status(StatusCode.ERROR, "upstream_error"),
        links=(Link(ctx(trace_id=0xAB, span_id=7, remote=True, state=LINK_STATE), {"k": 1}),),
    )  # fmt: skip
    children = [
        span(name, context=ctx(span_id=0x11 + i), parent=root.context, kind=SpanKind.INTERNAL, attributes={})
        for i, name in enumerate(("network", "prefill_wait", "decode"))
    ]
    request = ExportTraceServiceRequest.FromString(assert_same([root, *children]))
    (rs,) = request.resource_spans
    (ss,) = rs.scope_spans
    assert (ss.scope.name, ss.scope.version, ss.schema_url) == ("taotrace", "1.2.3", SCOPE.schema_url)
    assert {kv.key: kv.value.string_value for kv in rs.resource.attributes}["service.name"] == "taotrace"
    pb_root, *pb_children = ss.spans
    assert pb_root.trace_id == trace_id.to_bytes(16, "big") and pb_root.span_id == (0x10).to_bytes(8, "big")
    assert pb_root.parent_span_id == (0x01).to_bytes(8, "big") and pb_root.trace_state == "ot=th:8"
    assert pb_root.kind == pb_root.SPAN_KIND_CLIENT and pb_root.flags == 0x300  # the parent is remote
    attrs = {kv.key: kv.value for kv in pb_root.attributes}
    assert attrs["gen_ai.operation.name"].string_value == "chat" and attrs["taotrace.cost"].double_value == 0.0012
    assert [v.string_value for v in attrs["gen_ai.response.finish_reasons"].array_value.values] == ["stop"]
    assert attrs["gen_ai.request.stream"].bool_value and attrs["server.port"].int_value == 443
    assert (pb_root.status.code, pb_root.status.message) == (2, "upstream_error")
    (link,) = pb_root.links
    assert link.trace_id == (0xAB).to_bytes(16, "big") and link.span_id == (7).to_bytes(8, "big")
    assert (link.trace_state, link.flags) == ("vendor=abc,v2=1", 0x300)
    assert [(kv.key, kv.value.int_value) for kv in link.attributes] == [("k", 1)]
    assert [(c.name, c.kind, c.parent_span_id, c.flags) for c in pb_children] == [
        (name, pb_root.SPAN_KIND_INTERNAL, (0x10).to_bytes(8, "big"), 0x100)  # local parent
        for name in ("network", "prefill_wait", "decode")
    ]


UNENCODABLE: dict[str, Any] = {
    "int-too-large": 1 << 64,
    "int-too-small": -(1 << 63) - 1,
    "object": object(),
    "in-a-list": ("ok", 1 << 70),
    "surrogate": "\ud800",
    "set": {1, 2},
}


@pytest.mark.parametrize("key", list(UNENCODABLE))
def test_an_attribute_otlp_cannot_carry_is_skipped_and_counted(key: str) -> None:
    spans = [span(attributes={"a": 1, key: UNENCODABLE[key], "z": 2}, dropped_attributes=1)]
    if key == "surrogate":  # the library raises from protobuf here; the field is then absent
        request = ExportTraceServiceRequest.FromString(otlp.encode_spans(spans))
        (pb,) = request.resource_spans[0].scope_spans[0].spans
        assert [kv.key for kv in pb.attributes] == ["a", "z"] and pb.dropped_attributes_count == 2
        return
    assert_same(spans, dropped=1)


def test_unencodable_attributes_on_links_resources_and_scopes_are_counted() -> None:
    big = 1 << 64
    s = span(
        resource=Resource({"service.name": "x", "bad": big}),
        instrumentation_scope=Scope("s", "1", None, {"bad": big, "ok": 1}),
        links=(Link(ctx(span_id=7), {"bad": big, "ok": "v"}),),
        attributes={"bad key": big, "ok": 1, "bad": object()},
    )
    (rs,) = ExportTraceServiceRequest.FromString(otlp.encode_spans([s])).resource_spans
    (ss,) = rs.scope_spans
    (pb,) = ss.spans
    assert [kv.key for kv in rs.resource.attributes] == ["service.name"] and rs.resource.dropped_attributes_count == 1
    assert [kv.key for kv in ss.scope.attributes] == ["ok"] and ss.scope.dropped_attributes_count == 1
    assert [kv.key for kv in pb.links[0].attributes] == ["ok"] and pb.links[0].dropped_attributes_count == 1
    assert [kv.key for kv in pb.attributes] == ["ok"] and pb.dropped_attributes_count == 2


def test_proxy_spans_equal_the_library() -> None:
    """The spans `Spans` makes, root and children, for each scenario."""
    from tests.test_span_equivalence import SCENARIOS, make, run

    for name, (rec, src, query) in SCENARIOS.items():
        exporter, tel = make(capture_content=True)
        run(tel, rec, src, query)
        spans: Any = exporter.get_finished_spans()
        assert bool(spans) == (name != "unsampled-client")
        assert otlp.encode_spans(spans) == library(spans).SerializePartialToString()


def test_pause_lets_other_threads_in_without_changing_the_bytes() -> None:
    """The exporters' pause (GIL release) runs every PAUSE_EVERY spans; the output is the same."""
    spans = numbered([span(attributes={"n": i}) for i in range(3 * otlp.PAUSE_EVERY + 1)])
    calls: list[int] = []
    ours = otlp.encode_spans(spans, lambda: calls.append(1))
    assert len(calls) == 3
    assert ours == otlp.encode_spans(spans) == library(spans).SerializePartialToString()


def test_repeated_values_stay_correct_across_many_batches() -> None:
    """The attribute cache (bounded) never mixes values of equal hash (True vs 1, 1 vs 1.0), nor fields."""
    otlp.encode_spans(VARIANTS["scope-attributes"])  # {"n": 1} cached as a scope attribute
    otlp.encode_spans(VARIANTS["links"])  # {"k": 1} cached as a link attribute
    for i in range(3000):
        attributes = {"n": i, "b": bool(i % 2), "one": 1, "t": True, "f": 1.0, "s": f"v{i % 7}", "k": 1}
        s = span(attributes=attributes, links=(Link(ctx(span_id=7), {"n": i, "one": True}),))
        assert otlp.encode_spans([s]) == library([s]).SerializePartialToString()


def test_a_key_whose_values_change_type_is_encoded_as_each_value_is() -> None:
    """The cache keeps one slot per key for one value type: a value of another type, or a tuple
    equal to a cached one but not all strings ((1,) and (True,), (0.0,) and (-0.0,)), never takes
    a cached value's bytes."""
    values: list[Any] = [1, True, "1", ("1",), (1,), (True,), ("1",), 1.0, -0.0, 0.0, (0.0,), (-0.0,), 1, True]
    for value in values + values[::-1]:
        for _ in range(2):  # the second time may come from the cache
            s = span(attributes={"x": value, "stop": ("stop",)})
            assert otlp.encode_spans([s]) == library([s]).SerializePartialToString(), value


_primitive = st.one_of(
    st.text(),
    st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    st.floats(allow_nan=False),
)
_value = st.one_of(
    _primitive,
    st.binary(max_size=8),
    st.lists(st.text(max_size=8), max_size=4).map(tuple),
    st.lists(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1), max_size=4).map(tuple),
    st.lists(st.floats(allow_nan=False), max_size=4).map(tuple),
    st.lists(st.booleans(), max_size=4).map(tuple),
    st.lists(st.text(max_size=4), max_size=2),  # a list, not a tuple
)
_attributes = st.dictionaries(st.text(max_size=12), _value, max_size=8)


@settings(max_examples=300, deadline=None)
@given(attributes=_attributes, link_attributes=_attributes)
def test_any_attributes_encode_as_the_library_does(attributes: dict[str, Any], link_attributes: dict[str, Any]) -> None:
    s = span(attributes=attributes, links=(Link(ctx(span_id=7, remote=True), link_attributes),))
    assert otlp.encode_spans([s]) == library([s]).SerializePartialToString()


@settings(max_examples=200, deadline=None)
@given(
    attributes=st.dictionaries(
        st.text(max_size=6),
        st.one_of(_value, st.integers(min_value=1 << 63, max_value=1 << 80), st.builds(object)),
        max_size=8,
    )
)
def test_any_attributes_with_unencodable_ones_count_them(attributes: dict[str, Any]) -> None:
    bad = sum(1 for v in attributes.values() if type(v) is object or (type(v) is int and v >= 1 << 63))
    s = span(attributes=attributes)
    assert otlp.encode_spans([s]) == library([s], dropped=bad).SerializePartialToString()


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    _Collector.bodies = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    # shutdown() waits for the loop's next poll: 0.5 s by default, at every test's teardown
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _exporter(env: dict[str, str]) -> Any:
    provider = build_tracing(env)
    processor = provider.processor
    assert isinstance(processor, BatchSpanProcessor)
    return processor, processor.exporter


def test_our_exporter_sends_our_bytes(collector: str) -> None:
    provider, exporter = _exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": collector})
    assert type(exporter) is OtlpSpanExporter
    batches = [VARIANTS["all-attributes"] + VARIANTS["remote-parent"], *VARIANTS.values()]
    for batch in batches:
        assert exporter.export(batch) is True
    assert _Collector.bodies == [library(b).SerializePartialToString() for b in batches]
    exporter.shutdown()
    assert exporter.export(batches[0]) is False  # after shutdown
    provider.shutdown(5.0)


def test_our_exporter_with_a_dead_collector_fails_without_raising() -> None:
    provider, exporter = _exporter(
        # 0.5 s: shorter than the first back-off, so no retry (tests/test_span_exporter.py has those)
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "0.5"}
    )
    assert exporter.export(VARIANTS["status-ok"]) is False
    exporter.shutdown()
    provider.shutdown(5.0)


def test_our_exporter_reports_an_unencodable_batch_as_failed(collector: str) -> None:
    provider, exporter = _exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": collector})
    assert exporter.export([object()]) is False  # not a span: never raised
    assert _Collector.bodies == []
    provider.shutdown(5.0)
