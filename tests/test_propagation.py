"""W3C Trace Context in and out (proxy/telemetry/propagation.py), span attribute limits, and the
most attributes a root can carry against the default count limit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from opentelemetry.propagate import get_global_textmap
from opentelemetry.trace import SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AnyValue

from proxy.telemetry import propagation
from proxy.telemetry.span_end import bounded
from proxy.telemetry.tracing import SpanLimits, limits_from_env
from tests.maximal import maximal_infos, maximal_spans

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"00-{TRACE}-{SPAN}-01", (int(TRACE, 16), int(SPAN, 16), 1)),
        (f"00-{TRACE}-{SPAN}-00", (int(TRACE, 16), int(SPAN, 16), 0)),
        (f" 00-{TRACE}-{SPAN}-03\t", (int(TRACE, 16), int(SPAN, 16), 3)),  # surrounding blanks
        (f"01-{TRACE}-{SPAN}-01-future-part", (int(TRACE, 16), int(SPAN, 16), 1)),  # a later version may add
        (f"00-{TRACE}-{SPAN}-01-extra", None),  # version 00 has exactly four fields
        (f"ff-{TRACE}-{SPAN}-01", None),  # version ff is forbidden
        (f"00-{'0' * 32}-{SPAN}-01", None),  # all-zero trace id
        (f"00-{TRACE}-{'0' * 16}-01", None),  # all-zero parent id
        (f"00-{TRACE.upper()}-{SPAN}-01", None),  # upper-case hex
        (f"00-{TRACE[:-1]}-{SPAN}-01", None),
        ("garbage", None),
        ("", None),
    ],
)
def test_traceparent_as_w3c_defines_it(header: str, expected: tuple[int, int, int] | None) -> None:
    assert propagation.parse_traceparent(header) == expected
    # The OpenTelemetry API's own propagator agrees (valid or not, and on the ids).
    theirs = TraceContextTextMapPropagator().extract({"traceparent": header})
    from opentelemetry import trace

    ctx = trace.get_current_span(theirs).get_span_context()
    assert ctx.is_valid == (expected is not None)
    if expected is not None:
        assert (ctx.trace_id, ctx.span_id, int(ctx.trace_flags)) == expected


def test_tracestate_is_read_as_the_api_reads_it_and_written_back() -> None:
    ctx = propagation.parse({"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "a=1,b=2, bad entry"})
    assert ctx is not None and ctx.is_remote and ctx.trace_flags.sampled
    assert ctx.trace_state == TraceState.from_header(["a=1,b=2, bad entry"])
    assert propagation.parse({"tracestate": "a=1"}) is None
    ours = SpanContext(int(TRACE, 16), 0x1234, False, TraceFlags(3), TraceState())
    assert propagation.format_traceparent(ours) == f"00-{TRACE}-0000000000001234-03"


def test_our_traceparent_is_the_ids_in_fixed_width_hex() -> None:
    for trace_id, span_id, flags in ((1, 1, 0), ((1 << 128) - 1, (1 << 64) - 1, 255), (0xABC << 64, 0x10, 1)):
        ctx = SpanContext(trace_id, span_id, False, TraceFlags(flags), TraceState())
        assert propagation.format_traceparent(ctx) == f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
        assert propagation.parse_traceparent(propagation.format_traceparent(ctx)) == (trace_id, span_id, flags)


def test_the_default_propagators_are_w3c_by_their_fields() -> None:
    assert propagation.is_w3c(get_global_textmap())
    assert propagation.is_w3c(TraceContextTextMapPropagator())

    class B3Like(TraceContextTextMapPropagator):
        @property
        def fields(self) -> set[str]:
            return {"x-b3-traceid", "traceparent"}

    assert not propagation.is_w3c(B3Like())


def test_limits_from_the_environment() -> None:
    assert limits_from_env({}) == SpanLimits(128, None)
    assert limits_from_env({"OTEL_ATTRIBUTE_COUNT_LIMIT": "5", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "3"}) == SpanLimits(
        5, 3
    )
    env = {
        "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "7",
        "OTEL_ATTRIBUTE_COUNT_LIMIT": "5",
        "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "x",
    }
    assert limits_from_env(env) == SpanLimits(7, None)


def test_bounded_keeps_the_latest_and_cuts_strings() -> None:
    attrs: dict[str, AnyValue] = {"a": "long value", "b": 1, "c": ("xyz", "uvwxyz", 2), "d": True}
    assert bounded(attrs, SpanLimits(2, None)) == ({"c": ("xyz", "uvwxyz", 2), "d": True}, 2)
    assert bounded(attrs, SpanLimits(128, 3)) == ({"a": "lon", "b": 1, "c": ("xyz", "uvw", 2), "d": True}, 0)


def test_no_root_reaches_the_default_count_limit_and_the_docs_say_how_many() -> None:
    most = max(len(s.attributes) for info in maximal_infos() for s in maximal_spans(info) if s.parent is None)
    assert most < SpanLimits().count
    doc = (Path(__file__).resolve().parent.parent / "docs" / "spans.md").read_text()
    said = re.search(r"the proxy's spans carry at most (\d+)", doc)
    assert said is not None and int(said.group(1)) == most


def test_a_restarted_trace_never_carries_the_clients_tracestate() -> None:
    """An invalid traceparent starts a new trace: the client's tracestate must not go with it."""
    from multidict import CIMultiDict, CIMultiDictProxy

    from proxy.telemetry.spans import Spans
    from proxy.telemetry.tracing import Tracing
    from tests.test_span_equivalence import INFO, T0

    tel = Spans(Tracing(), upstream_host="h", upstream_port=1, upstream_base="http://h:1")
    for traceparent in ("00-zzzz-bad-01", f"00-{'0' * 32}-{SPAN}-01"):
        src = CIMultiDictProxy(CIMultiDict({"traceparent": traceparent, "tracestate": "vendor=secretstate"}))
        headers = CIMultiDict(src)
        tel.inject(tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0), headers)
        assert "tracestate" not in headers and headers["traceparent"] != traceparent
    valid = CIMultiDictProxy(CIMultiDict({"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "vendor=v"}))
    headers = CIMultiDict(valid)
    tel.inject(tel.start(INFO, "POST", "/v1/chat/completions", "", valid, T0), headers)
    assert headers.getall("tracestate") == ["vendor=v"]  # continued with the trace it belongs to
