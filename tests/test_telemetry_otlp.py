"""proxy.telemetry.otlp encodes spans exactly as the OTLP library does (bytes, and decoded messages)."""

from __future__ import annotations

import http.server
import itertools
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import (
    encode_spans as library_encode_spans,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from proxy.telemetry import otlp
from proxy.telemetry.span_exporter import OtlpSpanExporter
from proxy.telemetry.spans import build_tracer_provider

RESOURCE = Resource.create(
    {
        "service.name": "taotrace",
        "service.version": "1.2.3",
        "host.cores": 2,
        "k8s.ok": True,
        "ratio": 0.5,
        "tags": ("a", "b"),
    }
)
SCOPE = InstrumentationScope("taotrace", "1.2.3")

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
}


def ctx(
    trace_id: int = 0x4BF92F3577B34DA6A3CE929D0E0E4736,
    span_id: int = 0x1001,
    remote: bool = False,
    state: TraceState | None = None,
) -> SpanContext:
    return SpanContext(trace_id, span_id, remote, TraceFlags(0x03), state)


def span(name: str = "chat gpt-4o-mini", **kw: Any) -> ReadableSpan:
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
    return ReadableSpan(name, **args)


VARIANTS: dict[str, list[ReadableSpan]] = {
    **{f"attr-{k}": [span(attributes={"a": 1, f"v.{k}": v, "z": "end"})] for k, v in ATTRIBUTE_VALUES.items()},
    "all-attributes": [span(attributes={f"v.{k}": v for k, v in ATTRIBUTE_VALUES.items()})],
    "no-attributes": [span(attributes=None)],
    "status-unset": [span(status=Status(StatusCode.UNSET))],
    "status-ok": [span(status=Status(StatusCode.OK))],
    "status-error": [span(status=Status(StatusCode.ERROR, "upstream_5xx"))],
    "status-error-no-description": [span(status=Status(StatusCode.ERROR))],
    "tracestate": [span(context=ctx(state=TraceState([("vendor", "abc"), ("other", "1")])))],
    "local-parent": [span(parent=ctx(span_id=0x2002))],
    "remote-parent": [span(parent=ctx(span_id=0x2002, remote=True, state=TraceState([("v", "1")])))],
    "kinds": [span(kind=k) for k in SpanKind],
    "empty-name": [span(name="")],
    "zero-times": [span(start_time=0, end_time=None)],
    "events": [span(events=[Event("e", {"k": 1}, timestamp=5)])],  # the library's own path
    "links": [span(links=[Link(ctx(span_id=7), {"k": 1})])],
    "mapping-attribute": [span(attributes={"m": {"a": 1}})],
    "int-too-large": [span(attributes={"a": 1, "big": 1 << 64, "z": 2})],  # the library logs and skips it
    "no-scope": [span(instrumentation_scope=None)],
    "scope-attributes": [
        span(instrumentation_scope=InstrumentationScope("s", None, "https://schema", {"k": "v", "n": 1}))
    ],
    "resource-schema": [span(resource=Resource({"service.name": "x"}, "https://opentelemetry.io/schemas/1.21.0"))],
    "empty-resource": [span(resource=Resource({}))],
    "two-resources-and-scopes": [
        span(resource=r, instrumentation_scope=s, name=f"{i}")
        for i, (r, s) in enumerate(
            itertools.product(
                [
                    RESOURCE,
                    Resource({"service.name": "other"}),
                    Resource.create(
                        {
                            "service.name": "taotrace",
                            "service.version": "1.2.3",
                            "host.cores": 2,
                            "k8s.ok": True,
                            "ratio": 0.5,
                            "tags": ("a", "b"),
                        }
                    ),
                ],
                [
                    SCOPE,
                    InstrumentationScope("other"),
                    InstrumentationScope("taotrace", "1.2.3"),
                ],
            )
        )
    ],
    "empty-batch": [],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bytes_and_messages_equal_the_library(variant: str) -> None:
    spans = VARIANTS[variant]
    expected = library_encode_spans(spans)
    for _ in range(2):  # the second time from the caches
        ours = otlp.encode_spans(spans)
        assert ExportTraceServiceRequest.FromString(ours) == expected
        assert ours == expected.SerializePartialToString()


def test_proxy_spans_equal_the_library() -> None:
    """The spans Telemetry makes, through the fast paths (root, children)."""
    from tests.test_telemetry_fast import SCENARIOS, make, run

    for name, (rec, src, query) in SCENARIOS.items():
        provider, exporter, tel = make(processor="simple", capture_content=True)
        run(tel, rec, src, query)
        assert bool(exporter.spans) == (name != "unsampled-client")
        assert otlp.encode_spans(exporter.spans) == library_encode_spans(exporter.spans).SerializePartialToString()
        provider.shutdown()


def test_pause_lets_other_threads_in_without_changing_the_bytes() -> None:
    """The exporters' pause (GIL release) runs every PAUSE_EVERY spans; the output is the same."""
    spans = [span(attributes={"n": i}) for i in range(3 * otlp.PAUSE_EVERY + 1)]
    calls: list[int] = []
    ours = otlp.encode_spans(spans, lambda: calls.append(1))
    assert len(calls) == 3
    assert ours == otlp.encode_spans(spans) == library_encode_spans(spans).SerializePartialToString()


def test_repeated_values_stay_correct_across_many_batches() -> None:
    """The attribute cache (bounded) never mixes values of equal hash (True vs 1, 1 vs 1.0), nor fields."""
    otlp.encode_spans(VARIANTS["scope-attributes"])  # {"n": 1} cached as a scope attribute
    for i in range(3000):
        s = span(
            attributes={
                "n": i,
                "b": bool(i % 2),
                "one": 1,
                "t": True,
                "f": 1.0,
                "s": f"v{i % 7}",
            }
        )
        assert otlp.encode_spans([s]) == library_encode_spans([s]).SerializePartialToString()


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
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _exporter(env: dict[str, str]) -> Any:
    provider = build_tracer_provider(env)
    (processor,) = provider._active_span_processor._span_processors
    return provider, processor.span_exporter  # type: ignore[attr-defined]  # the batch processor's


def test_our_exporter_sends_the_library_bytes(collector: str) -> None:
    provider, exporter = _exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": collector})
    assert type(exporter) is OtlpSpanExporter
    batches = [VARIANTS["all-attributes"] + VARIANTS["events"] + VARIANTS["remote-parent"], *VARIANTS.values()]
    for batch in batches:
        assert exporter.export(batch) == SpanExportResult.SUCCESS
    assert _Collector.bodies == [library_encode_spans(b).SerializePartialToString() for b in batches]
    exporter.shutdown()
    assert exporter.export(batches[0]) == SpanExportResult.FAILURE  # after shutdown, as the library's
    provider.shutdown()


def test_our_exporter_with_a_dead_collector_fails_without_raising() -> None:
    provider, exporter = _exporter(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1"}
    )
    assert exporter.export(VARIANTS["status-ok"]) == SpanExportResult.FAILURE
    exporter.shutdown()
    provider.shutdown()


def test_our_exporter_reports_an_unencodable_batch_as_failed(collector: str) -> None:
    provider, exporter = _exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": collector})
    assert exporter.export([object()]) == SpanExportResult.FAILURE  # not a span: neither encoder copes
    assert _Collector.bodies == []
    provider.shutdown()
