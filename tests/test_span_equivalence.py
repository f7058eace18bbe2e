"""Our spans are the ones the OpenTelemetry SDK would make for the same request.

`Spans` builds its spans itself (no SDK span classes): each scenario and sampler here is run
through it and through a reference built on the SDK's public API (`Tracer.start_span`, the W3C
propagators, the SDK's samplers and id generator order), and the exported spans, the headers
sent upstream and the OTLP bytes (ours, and the library encoder's of the SDK's spans) compared;
then the contract itself is pinned.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource as SdkResource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace import sampling as sdk_sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor as SdkSimple
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter as SdkMemory
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy import __version__
from proxy.dialects import ANSWER, REASONING, RequestInfo, Usage
from proxy.exchange.record import RequestRecord
from proxy.exchange.timing import PhaseClock
from proxy.telemetry import otlp
from proxy.telemetry import sampler as ours
from proxy.telemetry.semconv import Conventions
from proxy.telemetry.span_pipeline import InMemorySpanExporter, SimpleSpanProcessor
from proxy.telemetry.spandata import Resource, SpanData
from proxy.telemetry.spans import NOT_TRACED, Spans
from proxy.telemetry.tracing import Tracing
from tests.otel_versions import ENCODER_WRITES_SCOPE_FIELDS
from tests.spanning import finish, phases

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
T0 = 1000.0
OFFSET = 1_700_000_000_000_000_000
RESOURCE_ATTRIBUTES = {"service.name": "taotrace", "service.version": __version__}
# Newer SDKs set W3C level 2's random-trace-id flag on the traces they start; so do we.
SDK_RANDOM_FLAG = hasattr(TraceFlags, "RANDOM_TRACE_ID")


class CountingIds(RandomIdGenerator):
    """Deterministic ids, still declared random (so the W3C random-trace-id flag is exercised)."""

    random_trace_id = SDK_RANDOM_FLAG

    def __init__(self) -> None:
        self.n = 0

    def generate_span_id(self) -> int:
        self.n += 1
        return 0x1000 + self.n

    def generate_trace_id(self) -> int:
        self.n += 1
        return 0xABC000 + self.n


class Tagging(Sampler):
    """A plug-in sampler that adds an attribute to every span it samples."""

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {"sampler.tag": name})

    def get_description(self) -> str:
        return "Tagging"


class DropPrefill(Sampler):
    """A plug-in sampler with a per-name decision."""

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        return SamplingResult(Decision.DROP if name == "prefill_wait" else Decision.RECORD_AND_SAMPLE)

    def get_description(self) -> str:
        return "DropPrefill"


def streamed(
    error_type: str = "", sent: bool = True, tokens: int = 5, connect: bool = False, reasoning: str = ""
) -> RequestRecord:
    """`reasoning`: "streamed" (two reasoning tokens first, then thinking again at the fourth) or
    "hidden" (reported, not streamed: an estimated `thinking` inside prefill_wait)."""
    p = PhaseClock(T0)
    if connect:
        p.reused, p.pool_wait, p.dns, p.connect = False, 0.0001, 0.002, 0.003
    else:
        p.reused = True
    if sent:
        p.sent(T0 + 0.001)
        p.headers(T0 + 0.05)
        p.body_bytes(T0 + 0.05)
        kinds = (REASONING, REASONING, ANSWER, REASONING) if reasoning == "streamed" else ()
        for i in range(tokens):
            p.token(T0 + 0.2 + i * 0.01, kinds[i] if i < len(kinds) else ANSWER)
    hidden = 40 if reasoning == "hidden" else None
    timing = p.finish(T0 + 0.5, tokens + (hidden or 0) if sent and tokens else None, reasoning_tokens=hidden)
    usage = Usage(12, tokens + (hidden or 0), 3, hidden) if sent else Usage()
    return RequestRecord(
        trace_id=None,
        api="chat_completions",
        operation="chat",
        model="gpt-4o-mini",
        response_model="gpt-4o-mini-2024-07-18" if sent else None,
        stream=True,
        method="POST",
        path="/v1/chat/completions",
        status_code=200 if not error_type else 502,
        error_type=error_type,
        timing=timing,
        usage=usage,
        usage_source="reported" if sent else "none",
        finish_reasons=("stop",) if sent else (),
        response_id="chatcmpl-1" if sent else None,
    )


INFO = RequestInfo("chat_completions", "chat", "openai", "gpt-4o-mini", True, content='[{"role":"user"}]')


def carrier(
    traceparent: bool = False, tracestate: bool = False, extra: dict[str, str] | None = None
) -> CIMultiDictProxy[str]:
    h = CIMultiDict({"Content-Type": "application/json", "Authorization": "Bearer sk-secret"})
    if traceparent:
        h["TraceParent"] = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"  # header names are case-insensitive
    if tracestate:
        h["tracestate"] = "vendor=abc,other=1"
    h.update(extra or {})
    return CIMultiDictProxy(h)


def scope(s: Any) -> tuple[Any, ...]:
    return (s.name, s.version, s.schema_url, dict(s.attributes or {}))


def snapshot(span: ReadableSpan | SpanData) -> tuple[Any, ...]:
    def ctx(c: Any) -> Any:
        return (
            None if c is None else (c.trace_id, c.span_id, c.is_remote, int(c.trace_flags), c.trace_state.to_header())
        )

    return (
        span.name, ctx(span.context), ctx(span.parent), span.kind, dict(span.attributes or {}),
        span.status.status_code, span.status.description, span.start_time, span.end_time,
        dict(span.resource.attributes), scope(span.instrumentation_scope), tuple(span.events),
        tuple((ctx(link.context), dict(link.attributes or {})) for link in span.links),
        span.dropped_attributes,
    )  # fmt: skip


SCENARIOS = {
    "stream": (streamed(), carrier(), ""),
    "stream-connect": (streamed(connect=True), carrier(), "api-version=1&key=secret"),
    "client-traceparent": (streamed(), carrier(traceparent=True, tracestate=True), ""),
    "no-tokens": (streamed(tokens=0), carrier(), ""),
    "connect-error": (streamed(error_type="connect", sent=False), carrier(), ""),
    "upstream-error": (streamed(error_type="upstream_5xx"), carrier(traceparent=True), ""),
    "baggage-header": (streamed(), carrier(extra={"baggage": "k=v"}), ""),
    "unsampled-client": (
        streamed(),
        CIMultiDictProxy(CIMultiDict({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"})),
        "",
    ),
    "client-random-flag": (
        streamed(),
        CIMultiDictProxy(CIMultiDict({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-03"})),
        "",
    ),
    "not-streamed": (streamed(tokens=0, sent=True), carrier(), "a=1"),
    "reasoning-streamed": (streamed(reasoning="streamed"), carrier(traceparent=True), ""),
    "reasoning-hidden": (streamed(reasoning="hidden"), carrier(), ""),
}
# name: (ours, the SDK's)
SAMPLERS: dict[str, tuple[ours.Sampler, Sampler]] = {
    "default": (ours.DEFAULT, sdk_sampling.DEFAULT_ON),
    "always_on": (ours.ALWAYS_ON, sdk_sampling.ALWAYS_ON),
    "parentbased_on": (ours.ParentBased(ours.ALWAYS_ON), sdk_sampling.DEFAULT_ON),
    "parentbased_off": (ours.ParentBased(ours.ALWAYS_OFF), sdk_sampling.DEFAULT_OFF),
    "ratio": (ours.ParentBased(ours.TraceIdRatio(1.0)), sdk_sampling.ParentBasedTraceIdRatio(1.0)),
    "ratio-0": (ours.ParentBased(ours.TraceIdRatio(0.0)), sdk_sampling.ParentBasedTraceIdRatio(0.0)),
    "traceidratio-half": (ours.TraceIdRatio(0.5), sdk_sampling.TraceIdRatioBased(0.5)),
    "traceidratio-0": (ours.TraceIdRatio(0.0), sdk_sampling.TraceIdRatioBased(0.0)),
    "always_off": (ours.ALWAYS_OFF, sdk_sampling.ALWAYS_OFF),
    "tagging": (ours.SdkSampler(Tagging()), Tagging()),
    "drop-prefill": (ours.SdkSampler(DropPrefill()), DropPrefill()),
}
SCHEMA_URL = Conventions().schema_url


def make(sampler: str = "default", **kw: Any) -> tuple[InMemorySpanExporter, Spans]:
    """Our `Spans` with counting ids and an in-memory exporter."""
    exporter = InMemorySpanExporter()
    tracing = Tracing(
        processor=SimpleSpanProcessor(exporter),
        sampler=SAMPLERS[sampler][0],
        resource=Resource(RESOURCE_ATTRIBUTES),
        ids=CountingIds(),
    )
    tel = Spans(tracing, upstream_host="api.example", upstream_port=443, upstream_base="https://api.example", **kw)
    tel._offset_ns = OFFSET
    return exporter, tel


def run(tel: Spans, rec: RequestRecord, src: CIMultiDictProxy[str], query: str = "") -> CIMultiDict[str]:
    headers = CIMultiDict(src)
    span = tel.start(INFO, "POST", "/v1/chat/completions", query, src, T0)
    tel.inject(span, headers)
    finish(tel, span, rec, "tok0 tok1")
    return headers


def reference(
    sampler: str, rec: RequestRecord, src: CIMultiDictProxy[str], query: str, parent: str, ours: Sequence[SpanData]
) -> tuple[tuple[ReadableSpan, ...], CIMultiDict[str]]:
    """The same request through the SDK's public API: what a tracer would export.

    The attributes are taken from `ours`, the spans our `Spans` exported for it (their values
    are pinned by tests/test_spans.py); what this checks is everything else: ids, sampling,
    parents, links, flags, trace state, kinds, times, statuses, the headers upstream, and the
    encoding."""
    root_attributes = next((dict(s.attributes) for s in ours if s.kind is SpanKind.CLIENT), {})
    exporter = SdkMemory()
    provider = TracerProvider(
        sampler=SAMPLERS[sampler][1], id_generator=CountingIds(), resource=SdkResource(RESOURCE_ATTRIBUTES)
    )
    provider.add_span_processor(SdkSimple(exporter))
    tracer = provider.get_tracer("taotrace", __version__, schema_url=SCHEMA_URL)
    ctx = propagate.extract(src)
    links = []
    if parent != "child":
        caller = trace.get_current_span(ctx).get_span_context()
        if parent == "link" and caller.is_valid:
            links.append(Link(caller))
        ctx = Context()
    root = tracer.start_span(
        f"{INFO.operation} {INFO.model}", context=ctx, kind=SpanKind.CLIENT, attributes=root_attributes,
        start_time=int(T0 * 1e9) + OFFSET, links=links or None,
    )  # fmt: skip
    headers = CIMultiDict(src)
    if parent == "child" or "traceparent" not in headers:
        propagate.inject(headers, context=trace.set_span_in_context(root))
        if not root.get_span_context().trace_state and "tracestate" in headers:
            del headers["tracestate"]  # ours: a client's tracestate never rides with a trace it is not in
    if root.is_recording():
        root.set_attributes(root_attributes)  # a plug-in sampler's result replaced those given at start
        made: list[Any] = []
        for name, begin, end, attrs, status, up in phases(rec, OFFSET):
            above = root if up < 0 else made[up]
            child = tracer.start_span(
                name, context=trace.set_span_in_context(above), kind=SpanKind.INTERNAL, start_time=begin
            )
            made.append(child)
            child.set_attributes(attrs)
            if status is not None:
                child.set_status(status)
            child.end(end_time=end)
        if rec.error_type:
            root.set_status(Status(StatusCode.ERROR, rec.error_type))
    root.end(end_time=int(rec.timing.end * 1e9) + OFFSET)
    provider.shutdown()
    return exporter.get_finished_spans(), headers


def compare(sampler: str, scenario: str, parent: str = "child") -> tuple[tuple[SpanData, ...], CIMultiDict[str]]:
    if scenario == "client-random-flag" and parent == "child" and not SDK_RANDOM_FLAG:
        pytest.skip(
            "an SDK before 1.42 (no TraceFlags.RANDOM_TRACE_ID) drops the caller's random-trace-id flag; ours keeps it, as W3C level 2 and the SDK since ask"
        )
    rec, src, query = SCENARIOS[scenario]
    exporter, tel = make(sampler, capture_content=True, parent=parent)
    headers = run(tel, rec, src, query)
    spans = exporter.get_finished_spans()
    sdk_spans, sdk_headers = reference(sampler, rec, src, query, parent, spans)
    assert list(headers.items()) == list(sdk_headers.items())
    if sampler == "tagging":  # the SDK puts a sampler's attributes first; we add them after ours
        assert [{**dict(s.attributes)} for s in spans] == [{**dict(s.attributes)} for s in sdk_spans]
        return spans, headers
    assert [snapshot(s) for s in spans] == [snapshot(s) for s in sdk_spans]
    library = encode_spans(sdk_spans)
    if not ENCODER_WRITES_SCOPE_FIELDS:  # the encoder before 1.31 left the scope's schema URL out: the SDK span's
        for ss in (ss for rs in library.resource_spans for ss in rs.scope_spans):
            ss.schema_url = sdk_spans[0].instrumentation_scope.schema_url or ""
    ours_bytes, library_bytes = otlp.encode_spans(spans), library.SerializePartialToString()
    if any(s.links for s in spans):  # the library leaves a link's trace state out; we send it
        decoded = ExportTraceServiceRequest.FromString(ours_bytes)
        for span in (s for rs in decoded.resource_spans for ss in rs.scope_spans for s in ss.spans):
            for link in span.links:
                link.ClearField("trace_state")
        ours_bytes = decoded.SerializePartialToString()
    assert ours_bytes == library_bytes
    return spans, headers


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_our_spans_are_the_sdks(scenario: str, sampler: str) -> None:
    spans, _ = compare(sampler, scenario)
    src = SCENARIOS[scenario][1]
    parent_based = sampler in ("default", "parentbased_on", "parentbased_off", "ratio", "ratio-0")
    exports = sampler not in ("always_off", "traceidratio-0") and not (parent_based and scenario == "unsampled-client")
    if sampler in ("parentbased_off", "ratio-0"):
        exports = exports and "traceparent" in src
    if sampler == "traceidratio-half":  # the client's trace id is above the ratio's bound, ours below
        exports = exports and "traceparent" not in src
    assert bool(spans) == exports, "a scenario that exports nothing proves little: expected spans"
    if sampler == "drop-prefill" and spans:
        assert "prefill_wait" not in [s.name for s in spans]
    if sampler == "tagging" and spans:
        assert all(s.attributes["sampler.tag"] == s.name for s in spans)


@pytest.mark.parametrize("parent", ["link", "none"])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("scenario", [name for name, (_r, src, _q) in SCENARIOS.items() if "traceparent" in src])
def test_parent_link_and_none_start_a_trace_of_their_own(scenario: str, sampler: str, parent: str) -> None:
    """`--parent link|none`: the caller's traceparent goes upstream as it came; the root starts a new
    trace (linked to the caller's span with `link`)."""
    spans, headers = compare(sampler, scenario, parent)
    assert list(headers.items()) == list(SCENARIOS[scenario][1].items())  # unchanged, tracestate and baggage too
    for span in spans:
        assert format(span.context.trace_id, "032x") != CLIENT_TRACE
        if span.kind.name == "CLIENT":
            assert span.parent is None
            linked = [(format(k.context.trace_id, "032x"), format(k.context.span_id, "016x")) for k in span.links]
            assert linked == ([(CLIENT_TRACE, CLIENT_SPAN)] if parent == "link" else [])
    exports = sampler not in ("always_off", "traceidratio-0", "parentbased_off", "ratio-0")  # roots of their own
    assert bool(spans) == exports


def test_parent_link_without_a_caller_trace_is_child_mode() -> None:
    """No traceparent from the caller: every mode sends ours upstream, as `child` does."""
    rec, src, query = SCENARIOS["stream"]
    for parent in ("child", "link", "none"):
        exporter, tel = make(capture_content=True, parent=parent)
        sent = run(tel, rec, src, query).get("traceparent")
        (root,) = [s for s in exporter.get_finished_spans() if s.kind.name == "CLIENT"]
        assert (
            root.links == ()
            and sent == f"00-{root.context.trace_id:032x}-{root.context.span_id:016x}-{root.context.trace_flags:02x}"
        )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "ParentBased(AlwaysOn)"),
        ({"OTEL_TRACES_SAMPLER": "always_on"}, "AlwaysOn"),
        ({"OTEL_TRACES_SAMPLER": "ALWAYS_OFF"}, "AlwaysOff"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}, "TraceIdRatio(0.5)"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "TraceIdRatio(1.0)"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x"}, "TraceIdRatio(1.0)"),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, "ParentBased(AlwaysOff)"),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
            "ParentBased(TraceIdRatio(0.25))",
        ),
        ({"OTEL_TRACES_SAMPLER": "no_such_sampler"}, "ParentBased(AlwaysOn)"),
    ],
)
def test_samplers_from_the_environment(env: dict[str, str], expected: str) -> None:
    assert repr(ours.sampler_from_env(env)) == expected


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 1.0])
def test_ratio_sampler_decides_as_the_sdks(ratio: float) -> None:
    mine, theirs = ours.TraceIdRatio(ratio), sdk_sampling.TraceIdRatioBased(ratio)
    for trace_id in [1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 0xFFFF << 64, *range(0, 1 << 64, (1 << 64) // 97)]:
        got = mine.should_sample(None, trace_id, "n", SpanKind.CLIENT, None, (), None).sampled
        assert got == theirs.should_sample(None, trace_id, "n").decision.is_sampled()


PLUGIN = """
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

ARGS = []


def ratio(arg):
    ARGS.append(arg)
    return TraceIdRatioBased(0.1 if arg is None else float(arg))


def broken(arg):
    raise RuntimeError("no")


def not_a_sampler(arg):
    return object()
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A real installed distribution (a .dist-info on sys.path) registering sampler entry points."""
    (tmp_path / "taotrace_test_plugin.py").write_text(PLUGIN)
    info = tmp_path / "taotrace_test_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: taotrace-test-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[opentelemetry_traces_sampler]\n"
        "MyRatio = taotrace_test_plugin:ratio\n"
        "broken = taotrace_test_plugin:broken\n"
        "not_a_sampler = taotrace_test_plugin:not_a_sampler\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    importlib.invalidate_caches()
    module = importlib.import_module("taotrace_test_plugin")
    yield module
    sys.modules.pop("taotrace_test_plugin", None)


class ByModel(Sampler):
    """A plug-in sampler that keeps one model's requests: it reads the root's attributes."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        self.seen.append(dict(attributes or {}))
        keep = (attributes or {}).get("gen_ai.request.model") == "gpt-4o-mini"
        return SamplingResult(Decision.RECORD_AND_SAMPLE if keep else Decision.DROP)

    def get_description(self) -> str:
        return "ByModel"


@pytest.mark.parametrize("wrap", [ours.SdkSampler, lambda s: ours.ParentBased(ours.SdkSampler(s))])
def test_a_sampler_that_reads_attributes_sees_them_at_the_start(wrap: Any) -> None:
    """The built-in samplers decide without the root's attributes (made when the request ends);
    a plug-in's, alone or under ParentBased, is given them when the root starts."""
    assert not any(s.reads_attributes for s in (ours.DEFAULT, ours.ALWAYS_OFF, ours.TraceIdRatio(0.5)))
    plug = ByModel()
    sampler = wrap(plug)
    assert sampler.reads_attributes
    exporter = InMemorySpanExporter()
    tel = Spans(
        Tracing(processor=SimpleSpanProcessor(exporter), sampler=sampler),
        upstream_host="api.example", upstream_port=443, upstream_base="https://api.example",
    )  # fmt: skip
    kept = tel.start(INFO, "POST", "/v1/chat/completions", "", CIMultiDictProxy(CIMultiDict()), T0)
    other = RequestInfo("chat_completions", "chat", "openai", "other-model", True)
    dropped = tel.start(other, "POST", "/v1/chat/completions", "", CIMultiDictProxy(CIMultiDict()), T0)
    assert [seen["gen_ai.request.model"] for seen in plug.seen] == ["gpt-4o-mini", "other-model"]
    assert plug.seen[0] == kept.attributes
    assert kept.context.trace_flags.sampled and not dropped.context.trace_flags.sampled


def test_a_plug_in_sampler_from_an_entry_point(plugin: Any, caplog: pytest.LogCaptureFixture) -> None:
    """An `opentelemetry_traces_sampler` entry point, found and called as the SDK does: by its name
    as registered, its factory given the argument as set (None when unset); asked for every child."""
    sampler = ours.sampler_from_env({"OTEL_TRACES_SAMPLER": "MyRatio"})
    assert isinstance(sampler, ours.SdkSampler) and not sampler.follows
    assert isinstance(sampler.sampler, sdk_sampling.TraceIdRatioBased) and sampler.sampler.rate == 0.1
    ours.sampler_from_env({"OTEL_TRACES_SAMPLER": "MyRatio", "OTEL_TRACES_SAMPLER_ARG": "0.5"})
    assert plugin.ARGS == [None, "0.5"]
    with caplog.at_level("WARNING", logger="taotrace"):
        for name in ("myratio", "broken", "not_a_sampler", "no_such_sampler"):  # case matters, as in the SDK
            assert ours.sampler_from_env({"OTEL_TRACES_SAMPLER": name}) is ours.DEFAULT
    assert len([r for r in caplog.records if "parentbased_always_on" in r.getMessage()]) == 4


@pytest.fixture
def in_memory() -> Iterator[tuple[InMemorySpanExporter, Spans]]:
    exporter = InMemorySpanExporter()
    tel = Spans(
        Tracing(processor=SimpleSpanProcessor(exporter)),
        upstream_host="api.example", upstream_port=443, upstream_base="https://api.example",
    )  # fmt: skip
    yield exporter, tel


def test_children_contract(in_memory: tuple[InMemorySpanExporter, Spans]) -> None:
    exporter, tel = in_memory
    t0 = time.perf_counter()
    rec = streamed(connect=True)
    src = carrier(traceparent=True)
    headers = CIMultiDict(src)
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)
    tel.inject(span, headers)
    assert tel.trace_id(span) == CLIENT_TRACE
    finish(tel, span, rec)
    network, prefill, decode, root = exporter.get_finished_spans()
    assert [s.name for s in (network, prefill, decode, root)] == [
        "network",
        "prefill_wait",
        "decode",
        "chat gpt-4o-mini",
    ]
    assert root.kind == SpanKind.CLIENT and format(root.parent.span_id, "016x") == CLIENT_SPAN
    assert format(root.context.trace_id, "032x") == CLIENT_TRACE
    assert headers.getall("traceparent") == [
        f"00-{CLIENT_TRACE}-{root.context.span_id:016x}-{int(root.context.trace_flags):02x}"
    ]
    for child in (network, prefill, decode):
        assert child.kind == SpanKind.INTERNAL
        assert child.parent == root.context and child.context.trace_id == root.context.trace_id
        assert child.context.trace_flags == root.context.trace_flags and child.context.trace_flags.sampled
        assert child.resource is root.resource and child.instrumentation_scope == root.instrumentation_scope
        assert child.status.status_code == StatusCode.UNSET
    assert len({s.context.span_id for s in (network, prefill, decode, root)}) == 4
    t, ns = rec.timing, tel._ns
    assert (network.start_time, network.end_time) == (ns(t.start), ns(t.sent)) == (root.start_time, prefill.start_time)
    assert (prefill.end_time, decode.start_time, decode.end_time, root.end_time) == (
        ns(t.first_token),
        ns(t.first_token),
        ns(t.last_token),
        ns(t.end),
    )
    assert dict(network.attributes) == {
        "taotrace.connection.reused": False,
        "taotrace.pool_wait": 0.0001,
        "taotrace.dns": 0.002,
        "taotrace.connect": 0.003,
    }
    assert dict(prefill.attributes) == {}
    assert dict(decode.attributes) == {"taotrace.token_events": 5}
    assert "gen_ai.input.messages" not in root.attributes and "gen_ai.output.messages" not in root.attributes
    assert (
        abs(root.start_time - time.time_ns() + (time.perf_counter() - t0) * 1e9 - (T0 - t0) * 1e9) < 5e7
    )  # wall clock


def test_network_failure_marks_the_network_child(
    in_memory: tuple[InMemorySpanExporter, Spans],
) -> None:
    exporter, tel = in_memory
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0)
    finish(tel, span, streamed(error_type="connect", sent=False))
    network, root = exporter.get_finished_spans()
    assert (
        network.name == "network"
        and network.status.status_code == StatusCode.ERROR
        and network.status.description == "connect"
    )
    assert network.end_time == root.end_time
    assert root.status.status_code == StatusCode.ERROR and root.attributes["error.type"] == "connect"


def test_sampled_off_injects_flags_00_and_exports_nothing() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(processor=SimpleSpanProcessor(exporter), sampler=ours.ALWAYS_OFF)
    tel = Spans(tracing, upstream_host="h", upstream_port=1, upstream_base="http://h:1")
    headers: CIMultiDict[str] = CIMultiDict()
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0)
    tel.inject(span, headers)
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert version == "00" and int(trace_id, 16) and int(span_id, 16)
    assert int(flags, 16) & 0x01 == 0  # not sampled (0x02 is W3C's random-trace-id flag)
    assert tel.trace_id(span) is None
    finish(tel, span, streamed())
    assert exporter.get_finished_spans() == ()


def test_unsampled_client_parent_is_respected(
    in_memory: tuple[InMemorySpanExporter, Spans],
) -> None:
    exporter, tel = in_memory
    src = CIMultiDictProxy(CIMultiDict({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"}))
    headers: CIMultiDict[str] = CIMultiDict(src)
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)
    tel.inject(span, headers)
    assert headers["traceparent"].startswith(f"00-{CLIENT_TRACE}-") and int(headers["traceparent"][-2:], 16) & 0x01 == 0
    assert CLIENT_SPAN not in headers["traceparent"]
    assert tel.trace_id(span) is None
    finish(tel, span, streamed())
    assert exporter.get_finished_spans() == ()


def test_tracestate_is_continued_to_children_and_upstream(
    in_memory: tuple[InMemorySpanExporter, Spans],
) -> None:
    exporter, tel = in_memory
    src = carrier(traceparent=True, tracestate=True)
    headers = CIMultiDict(src)
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)
    tel.inject(span, headers)
    finish(tel, span, streamed())
    assert headers.getall("tracestate") == ["vendor=abc,other=1"]
    assert {s.context.trace_state.to_header() for s in exporter.get_finished_spans()} == {"vendor=abc,other=1"}


def test_a_request_not_traced_is_accepted(in_memory: tuple[InMemorySpanExporter, Spans]) -> None:
    """forward.py falls back to NOT_TRACED when start() raises."""
    exporter, tel = in_memory
    headers = CIMultiDict({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    tel.inject(NOT_TRACED, headers)
    assert headers.getall("traceparent") == [f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"]  # untouched, as before
    assert tel.trace_id(NOT_TRACED) is None
    finish(tel, NOT_TRACED, streamed())
    assert exporter.get_finished_spans() == ()


def test_other_propagators_keep_the_general_path(
    in_memory: tuple[InMemorySpanExporter, Spans],
) -> None:
    """With OTEL_PROPAGATORS naming something else, its headers are honoured (not just traceparent)."""

    class Single(TraceContextTextMapPropagator):  # W3C's format in a header of its own
        @property
        def fields(self) -> set[str]:
            return {"x-single"}

        def extract(self, carrier, context=None, getter=None):
            value = carrier.get("x-single")
            return super().extract({"traceparent": value} if value else {}, context)

    _, tel = in_memory
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([Single()]))
    try:
        src = CIMultiDictProxy(CIMultiDict({"x-single": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}))
        span = tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)
        assert tel.trace_id(span) == CLIENT_TRACE
        finish(tel, span, streamed())
    finally:
        propagate.set_global_textmap(before)
    assert tel.trace_id(tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)) != CLIENT_TRACE


def test_baggage_in_the_current_context_is_still_injected(
    in_memory: tuple[InMemorySpanExporter, Spans],
) -> None:
    _, tel = in_memory
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0)
    headers: CIMultiDict[str] = CIMultiDict()
    token = context.attach(baggage.set_baggage("tenant", "t1"))
    try:
        tel.inject(span, headers)
    finally:
        context.detach(token)
    assert headers["baggage"] == "tenant=t1"
    assert headers["traceparent"].split("-")[2] == format(span.get_span_context().span_id, "016x")


def test_inject_never_raises(in_memory: tuple[InMemorySpanExporter, Spans]) -> None:
    _, tel = in_memory

    class Broken(dict):  # type: ignore[type-arg]
        def __setitem__(self, key: str, value: str) -> None:
            raise RuntimeError("no")

    tel.inject(tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0), Broken())


def test_client_baggage_reaches_the_sampler() -> None:
    """A baggage header alone (no traceparent) is still extracted: samplers may read it."""
    seen: list[dict[str, object]] = []

    class Peek(Sampler):
        def should_sample(
            self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None
        ):
            seen.append(dict(baggage.get_all(parent_context)))
            return sdk_sampling.ALWAYS_ON.should_sample(parent_context, trace_id, name, kind, attributes, links)

        def get_description(self) -> str:
            return "Peek"

    tracing = Tracing(sampler=ours.SdkSampler(Peek()))
    tel = Spans(tracing, upstream_host="h", upstream_port=1, upstream_base="http://h:1")
    tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(extra={"baggage": "tenant=t1"}), T0)
    tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0)
    assert seen == [{"tenant": "t1"}, {}]
