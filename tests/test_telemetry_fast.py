"""Telemetry's fast paths export exactly what the SDK's general path exports.

The phase children are handed to end-only processors as finished spans, W3C headers are read and
written directly: each scenario is run through both paths and the exported spans (and their OTLP
encoding) compared field by field; then the contract itself is pinned.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import baggage, context, propagate
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    Decision,
    ParentBasedTraceIdRatio,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import INVALID_SPAN, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy.dialects import RequestInfo, Usage
from proxy.record import RequestRecord
from proxy.telemetry.spans import Telemetry
from proxy.timing import PhaseClock

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
T0 = 1000.0
OFFSET = 1_700_000_000_000_000_000


class CountingIds(RandomIdGenerator):
    """Deterministic ids, still declared random (so the W3C random-trace-id flag is exercised)."""

    def __init__(self) -> None:
        self.n = 0

    def generate_span_id(self) -> int:
        self.n += 1
        return 0x1000 + self.n

    def generate_trace_id(self) -> int:
        self.n += 1
        return 0xABC000 + self.n


class Collect(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


class Tagging(Sampler):
    """A custom sampler that adds an attribute: children must go through the SDK to get it."""

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {"sampler.tag": name})

    def get_description(self) -> str:
        return "Tagging"


class DropPrefill(Sampler):
    """A custom sampler with a per-name decision."""

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        return SamplingResult(Decision.DROP if name == "prefill_wait" else Decision.RECORD_AND_SAMPLE)

    def get_description(self) -> str:
        return "DropPrefill"


class Starts(SpanProcessor):
    """A processor with an on_start hook: the children must be real SDK spans for it."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def on_start(self, span, parent_context=None) -> None:
        self.started.append(span.name)


def streamed(error_type: str = "", sent: bool = True, tokens: int = 5, connect: bool = False) -> RequestRecord:
    p = PhaseClock(T0)
    if connect:
        p.reused, p.pool_wait, p.dns, p.connect = False, 0.0001, 0.002, 0.003
    else:
        p.reused = True
    if sent:
        p.sent(T0 + 0.001)
        p.headers(T0 + 0.05)
        p.body_bytes(T0 + 0.05)
        for i in range(tokens):
            p.token(T0 + 0.2 + i * 0.01)
    timing = p.finish(T0 + 0.5, tokens if sent and tokens else None, streaming=True)
    usage = Usage(12, tokens, 3, None) if sent else Usage()
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


def make(sampler: Sampler | None = None, processor: str = "simple", fast: bool = True, **kw: Any):
    provider = (
        TracerProvider(sampler=sampler, id_generator=CountingIds())
        if sampler
        else TracerProvider(id_generator=CountingIds())
    )
    exporter = Collect()
    provider.add_span_processor(BatchSpanProcessor(exporter) if processor == "batch" else SimpleSpanProcessor(exporter))
    tel = Telemetry(provider, upstream_host="api.example", upstream_port=443, upstream_base="https://api.example", **kw)
    tel._offset_ns = OFFSET
    if not fast:  # the SDK's general path, as before the fast paths existed
        tel._direct_ok = tel._root_ok = False
        tel._w3c_textmap = lambda: False  # type: ignore[method-assign]
    return provider, exporter, tel


def run(tel: Telemetry, rec: RequestRecord, src: CIMultiDictProxy[str], query: str = "") -> CIMultiDict[str]:
    headers = CIMultiDict(src)
    span = tel.start(INFO, "POST", "/v1/chat/completions", query, src, T0)
    tel.inject(span, headers)
    tel.finish(span, rec, "tok0 tok1")
    return headers


def snapshot(span: ReadableSpan) -> tuple[Any, ...]:
    def ctx(c: Any) -> Any:
        return (
            None if c is None else (c.trace_id, c.span_id, c.is_remote, int(c.trace_flags), c.trace_state.to_header())
        )

    return (
        span.name, ctx(span.context), ctx(span.parent), span.kind, dict(span.attributes or {}),
        span.status.status_code, span.status.description, span.start_time, span.end_time,
        dict(span.resource.attributes), span.instrumentation_scope, span.events,
        tuple((ctx(link.context), dict(link.attributes or {})) for link in span.links),
        span.dropped_attributes, span.dropped_events, span.dropped_links,
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
}
SAMPLERS = {
    "default": None,
    "always_on": ALWAYS_ON,
    "parentbased_on": DEFAULT_ON,
    "parentbased_off": DEFAULT_OFF,
    "ratio": ParentBasedTraceIdRatio(1.0),
    "ratio-0": ParentBasedTraceIdRatio(0.0),
    "traceidratio-half": TraceIdRatioBased(0.5),
    "traceidratio-0": TraceIdRatioBased(0.0),
    "always_off": ALWAYS_OFF,
    "tagging": Tagging(),
    "drop-prefill": DropPrefill(),
}


@pytest.mark.parametrize("processor", ["simple", "batch"])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_fast_path_exports_what_the_sdk_path_exports(scenario: str, sampler: str, processor: str) -> None:
    rec, src, query = SCENARIOS[scenario]
    results = []
    for fast in (True, False):
        provider, exporter, tel = make(SAMPLERS[sampler], processor, fast, capture_content=True)
        headers = run(tel, rec, src, query)
        provider.force_flush()
        results.append((exporter.spans, list(headers.items())))
        provider.shutdown()
    (fast_spans, fast_headers), (sdk_spans, sdk_headers) = results
    assert fast_headers == sdk_headers
    assert [snapshot(s) for s in fast_spans] == [snapshot(s) for s in sdk_spans]
    assert encode_spans(fast_spans).SerializeToString() == encode_spans(sdk_spans).SerializeToString()
    parent_based = sampler in ("default", "parentbased_on", "parentbased_off", "ratio", "ratio-0")
    exports = sampler not in ("always_off", "traceidratio-0") and not (parent_based and scenario == "unsampled-client")
    if sampler in ("parentbased_off", "ratio-0"):
        exports = exports and "traceparent" in src
    if sampler == "traceidratio-half":  # the client's trace id is above the ratio's bound, ours below
        exports = exports and "traceparent" not in src
    assert bool(fast_spans) == exports, "a scenario that exports nothing proves little: expected spans"


@pytest.mark.parametrize("parent", ["link", "none"])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("scenario", [name for name, (_r, src, _q) in SCENARIOS.items() if "traceparent" in src])
def test_parent_link_and_none_start_a_trace_of_their_own(scenario: str, sampler: str, parent: str) -> None:
    """`--parent link|none`: the caller's traceparent goes upstream as it came; the root starts a new
    trace (linked to the caller's span with `link`); fast and SDK paths export the same."""
    rec, src, query = SCENARIOS[scenario]
    results = []
    for fast in (True, False):
        provider, exporter, tel = make(SAMPLERS[sampler], "simple", fast, capture_content=True, parent=parent)
        headers = run(tel, rec, src, query)
        provider.force_flush()
        results.append((exporter.spans, list(headers.items())))
        provider.shutdown()
    (fast_spans, fast_headers), (sdk_spans, sdk_headers) = results
    assert fast_headers == sdk_headers == list(src.items())  # unchanged, tracestate and baggage too
    assert [snapshot(s) for s in fast_spans] == [snapshot(s) for s in sdk_spans]
    assert encode_spans(fast_spans).SerializeToString() == encode_spans(sdk_spans).SerializeToString()
    for span in fast_spans:
        assert format(span.context.trace_id, "032x") != CLIENT_TRACE
        if span.kind.name == "CLIENT":
            assert span.parent is None
            linked = [(format(k.context.trace_id, "032x"), format(k.context.span_id, "016x")) for k in span.links]
            assert linked == ([(CLIENT_TRACE, CLIENT_SPAN)] if parent == "link" else [])
    exports = sampler not in ("always_off", "traceidratio-0", "parentbased_off", "ratio-0")  # roots of their own
    assert bool(fast_spans) == exports


def test_parent_link_without_a_caller_trace_is_child_mode() -> None:
    """No traceparent from the caller: every mode sends ours upstream, as `child` does."""
    rec, src, query = SCENARIOS["stream"]
    sent = []
    for parent in ("child", "link", "none"):
        provider, exporter, tel = make(None, capture_content=True, parent=parent)
        sent.append(run(tel, rec, src, query).get("traceparent"))
        (root,) = [s for s in exporter.spans if s.kind.name == "CLIENT"]
        ours = f"00-{root.context.trace_id:032x}-{root.context.span_id:016x}-{root.context.trace_flags:02x}"
        assert root.links == () and sent[-1] == ours


ROOT_FAST_SAMPLERS = ("default", "always_on", "parentbased_on", "parentbased_off", "ratio", "traceidratio-half")


@pytest.mark.parametrize("sampler", ROOT_FAST_SAMPLERS)
def test_root_is_built_directly_for_built_in_samplers(sampler: str) -> None:
    _, _, tel = make(SAMPLERS[sampler], "batch")
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(traceparent=sampler != "traceidratio-half"), T0)
    assert type(span).__name__ == "Root"
    tel.finish(span, streamed())
    assert not span.is_recording()


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_TRACES_SAMPLER": "always_on"},
        {"OTEL_TRACES_SAMPLER": "always_off"},
        {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
        {"OTEL_TRACES_SAMPLER": "parentbased_always_off"},
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
        {"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "8"},  # the root must be bounded by the SDK
        {"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "10"},
        {"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "5"},
    ],
)
@pytest.mark.parametrize("traceparent", [False, True])
def test_env_configured_providers_export_the_same(
    env: dict[str, str], traceparent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    results = []
    for fast in (True, False):
        exporter = Collect()
        provider = TracerProvider(id_generator=CountingIds())  # sampler and limits from the environment
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tel = Telemetry(
            provider,
            upstream_host="api.example",
            upstream_port=443,
            upstream_base="https://api.example",
            capture_content=True,
        )
        tel._offset_ns = OFFSET
        if not fast:
            tel._direct_ok = tel._root_ok = False
            tel._w3c_textmap = lambda: False  # type: ignore[method-assign]
        headers = run(tel, streamed(), carrier(traceparent=traceparent, tracestate=traceparent))
        results.append((exporter.spans, list(headers.items())))
        provider.shutdown()
    (fast_spans, fast_headers), (sdk_spans, sdk_headers) = results
    assert fast_headers == sdk_headers
    assert [snapshot(s) for s in fast_spans] == [snapshot(s) for s in sdk_spans]
    assert encode_spans(fast_spans).SerializeToString() == encode_spans(sdk_spans).SerializeToString()


def test_limited_attributes_keep_the_sdk_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "8")
    _, exporter, tel = make()
    assert not tel._root_ok
    tel.finish(tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0), streamed())
    assert exporter.spans[-1].attributes["url.full"] == "https://"


def test_disabled_tracer_gives_a_non_recording_root() -> None:
    from opentelemetry.sdk.trace import _TracerConfig

    provider, exporter, tel = make()
    provider._set_tracer_configurator(tracer_configurator=lambda scope: _TracerConfig(is_enabled=False))
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0)
    assert not span.is_recording() and tel.trace_id(span) is None
    tel.finish(span, streamed())
    assert exporter.spans == []


def test_direct_root_behaves_like_a_span() -> None:
    provider, exporter, tel = make()
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0)
    assert type(span).__name__ == "Root"
    span.set_attribute("url.path", "/moved")  # an existing key moves to the end, as in the SDK
    span.set_attributes({"x.list": ["a", "b"]})
    span.update_name("renamed")
    span.set_status(StatusCode.OK)
    span.set_status(StatusCode.ERROR, "ignored after OK")
    span.add_event("ignored")
    span.end(end_time=OFFSET + 5)
    span.end(end_time=OFFSET + 9)  # a second end changes nothing
    span.set_attribute("late", 1)
    (root,) = exporter.spans
    assert root.name == "renamed" and root.end_time == OFFSET + 5 and root.status.status_code == StatusCode.OK
    assert list(root.attributes)[-2:] == ["url.path", "x.list"] and root.attributes["x.list"] == ("a", "b")
    assert "late" not in root.attributes and root.events == () and root.kind == SpanKind.CLIENT


@pytest.fixture
def in_memory() -> Iterator[tuple[TracerProvider, InMemorySpanExporter, Telemetry]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = Telemetry(provider, upstream_host="api.example", upstream_port=443, upstream_base="https://api.example")
    yield provider, exporter, tel
    provider.shutdown()


def test_children_contract(in_memory: tuple[TracerProvider, InMemorySpanExporter, Telemetry]) -> None:
    _, exporter, tel = in_memory
    assert tel._direct_ok  # the fast path is what this pins
    t0 = time.perf_counter()
    rec = streamed(connect=True)
    src = carrier(traceparent=True)
    headers = CIMultiDict(src)
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)
    tel.inject(span, headers)
    assert tel.trace_id(span) == CLIENT_TRACE
    tel.finish(span, rec)
    assert tel._direct and tel._follows  # the children were made directly
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
    in_memory: tuple[TracerProvider, InMemorySpanExporter, Telemetry],
) -> None:
    _, exporter, tel = in_memory
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0)
    tel.finish(span, streamed(error_type="connect", sent=False))
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
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = Telemetry(provider, upstream_host="h", upstream_port=1, upstream_base="http://h:1")
    headers: CIMultiDict[str] = CIMultiDict()
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0)
    tel.inject(span, headers)
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert version == "00" and int(trace_id, 16) and int(span_id, 16)
    assert int(flags, 16) & 0x01 == 0  # not sampled (0x02 is W3C's random-trace-id flag, set by newer SDKs)
    assert tel.trace_id(span) is None
    tel.finish(span, streamed())
    assert exporter.get_finished_spans() == ()


def test_unsampled_client_parent_is_respected(
    in_memory: tuple[TracerProvider, InMemorySpanExporter, Telemetry],
) -> None:
    _, exporter, tel = in_memory
    src = CIMultiDictProxy(CIMultiDict({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"}))
    headers: CIMultiDict[str] = CIMultiDict(src)
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)
    tel.inject(span, headers)
    assert headers["traceparent"].startswith(f"00-{CLIENT_TRACE}-") and int(headers["traceparent"][-2:], 16) & 0x01 == 0
    assert CLIENT_SPAN not in headers["traceparent"]
    assert tel.trace_id(span) is None
    tel.finish(span, streamed())
    assert exporter.get_finished_spans() == ()


def test_tracestate_is_continued_to_children_and_upstream(
    in_memory: tuple[TracerProvider, InMemorySpanExporter, Telemetry],
) -> None:
    _, exporter, tel = in_memory
    src = carrier(traceparent=True, tracestate=True)
    headers = CIMultiDict(src)
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)
    tel.inject(span, headers)
    tel.finish(span, streamed())
    assert headers.getall("tracestate") == ["vendor=abc,other=1"]
    assert {s.context.trace_state.to_header() for s in exporter.get_finished_spans()} == {"vendor=abc,other=1"}


def test_invalid_span_is_accepted(in_memory: tuple[TracerProvider, InMemorySpanExporter, Telemetry]) -> None:
    """forward.py falls back to INVALID_SPAN when start() raises."""
    _, exporter, tel = in_memory
    headers = CIMultiDict({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    tel.inject(INVALID_SPAN, headers)
    assert headers.getall("traceparent") == [f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"]  # untouched, as before
    assert tel.trace_id(INVALID_SPAN) is None
    tel.finish(INVALID_SPAN, streamed())
    assert exporter.get_finished_spans() == ()


def test_processor_with_on_start_gets_sdk_children() -> None:
    starts, exporter = Starts(), InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(starts)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = Telemetry(provider, upstream_host="h", upstream_port=1, upstream_base="http://h:1")
    tel.finish(tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0), streamed())
    assert starts.started == ["chat gpt-4o-mini", "network", "prefill_wait", "decode"]
    assert [s.name for s in exporter.get_finished_spans()] == ["network", "prefill_wait", "decode", "chat gpt-4o-mini"]


def test_processor_added_later_is_noticed() -> None:
    provider = TracerProvider()
    tel = Telemetry(provider, upstream_host="h", upstream_port=1, upstream_base="http://h:1")
    tel.finish(tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0), streamed())  # no processors at all
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel.finish(tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0), streamed())
    assert [s.name for s in exporter.get_finished_spans()] == ["network", "prefill_wait", "decode", "chat gpt-4o-mini"]
    assert exporter.get_finished_spans()[-1].attributes["gen_ai.usage.output_tokens"] == 5


def test_other_propagators_keep_the_general_path(
    in_memory: tuple[TracerProvider, InMemorySpanExporter, Telemetry],
) -> None:
    """With OTEL_PROPAGATORS naming something else, its headers are honoured (not just traceparent)."""

    class Single(TraceContextTextMapPropagator):  # a subclass: not the known W3C propagator
        def extract(self, carrier, context=None, getter=None):
            value = carrier.get("x-single")
            return super().extract({"traceparent": value} if value else {}, context)

    _, _, tel = in_memory
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([Single()]))
    try:
        src = CIMultiDictProxy(CIMultiDict({"x-single": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}))
        span = tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)
        assert tel.trace_id(span) == CLIENT_TRACE
        tel.finish(span, streamed())
    finally:
        propagate.set_global_textmap(before)
    assert tel.trace_id(tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)) != CLIENT_TRACE


def test_baggage_in_the_current_context_is_still_injected(
    in_memory: tuple[TracerProvider, InMemorySpanExporter, Telemetry],
) -> None:
    _, _, tel = in_memory
    span = tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0)
    headers: CIMultiDict[str] = CIMultiDict()
    token = context.attach(baggage.set_baggage("tenant", "t1"))
    try:
        tel.inject(span, headers)
    finally:
        context.detach(token)
    assert headers["baggage"] == "tenant=t1"
    assert headers["traceparent"].split("-")[2] == format(span.get_span_context().span_id, "016x")


def test_inject_never_raises(in_memory: tuple[TracerProvider, InMemorySpanExporter, Telemetry]) -> None:
    _, _, tel = in_memory

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
            return ALWAYS_ON.should_sample(parent_context, trace_id, name, kind, attributes, links)

        def get_description(self) -> str:
            return "Peek"

    tel = Telemetry(TracerProvider(sampler=Peek()), upstream_host="h", upstream_port=1, upstream_base="http://h:1")
    tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(extra={"baggage": "tenant=t1"}), T0)
    tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0)
    assert seen == [{"tenant": "t1"}, {}]
