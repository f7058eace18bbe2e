"""Our OTLP span exporter against real in-process collectors (HTTP and gRPC): the bytes it sends
decode to what the SDK's own encoder makes, the OTEL_EXPORTER_OTLP_* variables are honoured, and
429/503 (with Retry-After), other failures and a dead collector end as the spec says."""

from __future__ import annotations

import gzip
import http.server
import logging
import re
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

import grpc  # type: ignore[import-untyped]  # grpcio ships no type information
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as library_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from proxy.telemetry.batch_processor import BatchSpanProcessor
from proxy.telemetry.collector_log import collector_warnings
from proxy.telemetry.otlp_env import export_settings
from proxy.telemetry.otlp_transport import GrpcTransport, retry_after_seconds
from proxy.telemetry.span_exporter import OtlpSpanExporter, backoff
from proxy.telemetry.spandata import Resource, Scope, SpanData
from proxy.telemetry.tracing import build_tracing
from tests.test_telemetry_otlp import readable

RESOURCE = Resource({"service.name": "taotrace"})
SPANS = [
    SpanData(
        "chat gpt-4o-mini",
        context=SpanContext(0xABC, 0x1 + i, False, TraceFlags(1)),
        parent=None,
        resource=RESOURCE,
        attributes={"gen_ai.request.model": "gpt-4o-mini", "n": i},
        kind=SpanKind.CLIENT,
        start_time=1_000 + i,
        end_time=2_000 + i,
        instrumentation_scope=Scope("taotrace", "1"),
    )
    for i in range(3)
]
EXPECTED = ExportTraceServiceRequest.FromString(
    library_encode_spans([readable(s) for s in SPANS]).SerializePartialToString()
)


@dataclass
class Collector:
    """Answers each POST with the next scripted (status, headers); 200 once the script is used up."""

    url: str
    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
def collector() -> Iterator[Collector]:
    state = Collector("")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
            status, headers = state.script.pop(0) if state.script else (200, {})
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits for the loop's next poll: 0.5 s by default, at every test's teardown
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def exporter(env: dict[str, str], **options: Any) -> OtlpSpanExporter:
    settings = export_settings(env, "traces")
    assert settings is not None
    return OtlpSpanExporter(settings, **options)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_provider_exports_through_ours_and_the_bytes_decode_to_the_sdk_encoders(collector: Collector) -> None:
    provider = build_tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url})
    processor = provider.processor
    assert isinstance(processor, BatchSpanProcessor)
    ours = processor.exporter
    assert type(ours) is OtlpSpanExporter
    assert ours.export(SPANS) is True
    headers, body = collector.got[0]
    assert ExportTraceServiceRequest.FromString(body) == EXPECTED
    assert headers["content-type"] == "application/x-protobuf"
    assert processor.shutdown(5.0)
    assert ours.export(SPANS) is False  # after shutdown, as the SDK's


def test_headers_path_and_gzip_come_from_the_variables(collector: Collector) -> None:
    ours = exporter(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored.invalid:1",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url + "/custom/path",
            "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20k1,x-other=2",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "authorization=Bearer%20k2",  # the signal's own wins
            "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        }
    )
    assert ours.export(SPANS) is True
    headers, body = collector.got[0]
    assert headers["authorization"] == "Bearer k2" and "x-other" not in headers
    assert headers["content-encoding"] == "gzip"
    assert ExportTraceServiceRequest.FromString(gzip.decompress(body)) == EXPECTED
    ours.shutdown()


def test_deflate_is_a_zlib_stream_as_the_sdks_http_exporter_sends(collector: Collector) -> None:
    ours = exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "DEFLATE"})
    assert ours.export(SPANS) is True
    headers, body = collector.got[0]
    assert headers["content-encoding"] == "deflate"
    assert ExportTraceServiceRequest.FromString(zlib.decompress(body)) == EXPECTED
    ours.shutdown()


def test_429_waits_what_retry_after_asks_then_succeeds(collector: Collector) -> None:
    collector.script = [(429, {"Retry-After": "1"})]
    ours = exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_EXPORTER_OTLP_TIMEOUT": "20"})
    began = time.monotonic()
    assert ours.export(SPANS) is True
    assert time.monotonic() - began >= 0.95  # a lower bound: load only lengthens it
    assert [ExportTraceServiceRequest.FromString(b) for _, b in collector.got] == [EXPECTED, EXPECTED]
    assert ours.dropped == 0


def test_503_with_an_http_date_retry_after_is_honoured(collector: Collector) -> None:
    collector.script = [(503, {"Retry-After": formatdate(time.time() + 2, usegmt=True)})]
    ours = exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_EXPORTER_OTLP_TIMEOUT": "20"})
    began = time.monotonic()
    assert ours.export(SPANS) is True
    assert time.monotonic() - began >= 0.5  # the date has whole seconds: at least 1 s minus rounding
    assert len(collector.got) == 2


def test_a_retry_after_beyond_the_timeout_gives_up_at_once_and_counts_the_drop(
    collector: Collector, caplog: pytest.LogCaptureFixture
) -> None:
    collector.script = [(503, {"Retry-After": "120"})]
    ours = exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_EXPORTER_OTLP_TIMEOUT": "5"})
    began = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert ours.export(SPANS) is False
    assert time.monotonic() - began < 4  # never waited the 120 s, nor the 5 s timeout
    assert len(collector.got) == 1 and ours.dropped == len(SPANS)
    (record,) = [r for r in caplog.records if r.name == "proxy.telemetry.otlp_delivery"]
    assert 503 in record.args  # type: ignore[operator]  # the status, for CollectorLog


def test_a_final_status_is_not_retried(collector: Collector) -> None:
    collector.script = [(400, {})]
    ours = exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url})
    assert ours.export(SPANS) is False
    assert len(collector.got) == 1


def test_a_dead_collector_fails_within_the_timeout_without_raising() -> None:
    ours = exporter(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5"},
        jitter=lambda: 0.05,  # back-offs of 50, 100, 200 ms: retried within the timeout, then given up
    )
    began = time.monotonic()
    assert ours.export(SPANS) is False
    assert time.monotonic() - began < 0.5 + 5  # the deadline, plus a loaded machine's slack
    assert ours.dropped == len(SPANS)


def test_shutdown_ends_a_back_off_at_once(collector: Collector, caplog: pytest.LogCaptureFixture) -> None:
    """... and the export it ends is the exit's loss, said by the exit's own line: no warning of
    the exporter's, which could come after the collector's warnings stopped being ours (a raw
    line on stderr)."""
    caplog.set_level(logging.DEBUG)
    collector.script = [(503, {"Retry-After": "30"})]
    ours = exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_EXPORTER_OTLP_TIMEOUT": "60"})
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(ours.export(SPANS)))
    worker.start()
    for _ in range(500):
        if collector.got:
            break
        time.sleep(0.01)
    time.sleep(0.1)
    ours.shutdown()
    worker.join(10)
    assert result == [False]
    given_up = [r for r in caplog.records if r.getMessage().startswith("Failed to export")]
    assert [r.levelno for r in given_up] == [logging.DEBUG], caplog.text


async def test_the_collector_line_names_the_status(collector: Collector, caplog: pytest.LogCaptureFixture) -> None:
    collector.script = [(503, {"Retry-After": "120"})] * 2
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
    ours = exporter(env)
    with caplog.at_level(logging.DEBUG):
        async with collector_warnings(env, logging.getLogger("taotrace")):
            ours.export(SPANS)
    line = f"OTLP export to {collector.url} failed: HTTP 503 Service Unavailable; requests are not affected"
    assert [r.getMessage() for r in caplog.records if r.name == "taotrace"][0].startswith(line), caplog.text
    assert [r for r in caplog.records if r.name != "taotrace" and r.levelno >= logging.WARNING] == []


def test_retry_after_and_backoff() -> None:
    now = 1_700_000_000.0
    assert retry_after_seconds("7", now) == 7.0
    assert retry_after_seconds(formatdate(now + 30, usegmt=True), now) == pytest.approx(30, abs=1)
    assert retry_after_seconds(formatdate(now - 30, usegmt=True), now) == 0.0
    assert retry_after_seconds("soon", now) is None and retry_after_seconds(None, now) is None
    assert [backoff(a, 1.0) for a in range(8)] == [1, 2, 4, 8, 16, 32, 32, 32]


def test_settings_from_the_variables() -> None:
    assert export_settings({}, "traces") is None
    s = export_settings(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
        },
        "traces",
    )
    assert s is not None and (s.protocol, s.endpoint, s.insecure, s.timeout, s.compression) == (
        "grpc",
        "collector:4317",
        True,
        2.5,
        "gzip",
    )
    s = export_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "x"}, "traces")
    assert s is not None and (s.endpoint, s.insecure, s.timeout, s.compression) == (
        "https://c:4318/v1/traces",
        False,
        10.0,
        "",
    )
    # An exporter named for its protocol (the OTLP package's entry point names) fixes it.
    forced = export_settings(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        "traces",
        "http/protobuf",
    )
    assert forced is not None and (forced.protocol, forced.endpoint) == ("http/protobuf", "http://c:4318/v1/traces")


@pytest.mark.parametrize(
    "variable,value,said",
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "OTLP protocol 'http/json' is not supported: use grpc or http/protobuf"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift", "OTLP protocol 'thrift' is not supported: use grpc or http/protobuf"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "br", "OTLP compression 'br' is not supported: use gzip, deflate, none"),
    ],
)  # fmt: skip
def test_what_we_cannot_send_is_refused_never_sent_as_something_else(variable: str, value: str, said: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(said) + "$"):
        export_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", variable: value}, "traces")


class _GrpcCollector:
    def __init__(self, codes: list[grpc.StatusCode]) -> None:
        self.codes = codes
        self.got: list[tuple[bytes, dict[str, str]]] = []

    def export(self, request: bytes, context: Any) -> bytes:
        self.got.append((request, dict(context.invocation_metadata())))
        if self.codes:
            context.abort(self.codes.pop(0), "scripted")
        return b""  # an empty ExportTraceServiceResponse


@pytest.fixture
def grpc_collector() -> Iterator[tuple[str, _GrpcCollector]]:
    state = _GrpcCollector([])
    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(state.export)},  # bytes in, bytes out
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", state
    server.stop(None)


def test_grpc_sends_the_same_request_and_retries_unavailable(grpc_collector: tuple[str, _GrpcCollector]) -> None:
    url, state = grpc_collector
    state.codes = [grpc.StatusCode.UNAVAILABLE]
    ours = exporter(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=k",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "20",
        },
        jitter=lambda: 0.05,  # the first back-off 50 ms, not 1 s
    )
    assert ours.export(SPANS) is True
    assert [ExportTraceServiceRequest.FromString(b) for b, _ in state.got] == [EXPECTED, EXPECTED]
    assert state.got[0][1]["authorization"] == "k"
    state.codes = [grpc.StatusCode.INVALID_ARGUMENT]  # final: not retried
    assert ours.export(SPANS) is False
    assert len(state.got) == 3
    ours.shutdown()


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_grpc_compresses_as_asked(grpc_collector: tuple[str, _GrpcCollector], compression: str) -> None:
    """The call is compressed by gRPC itself (`grpc-encoding`); the collector gets the same request."""
    url, state = grpc_collector
    ours = exporter(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_COMPRESSION": compression,
        }
    )
    assert ours.export(SPANS) is True
    assert [ExportTraceServiceRequest.FromString(b) for b, _ in state.got] == [EXPECTED]
    transport = ours._delivery._transport
    assert isinstance(transport, GrpcTransport)
    assert transport._compression == {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}[compression]
    ours.shutdown()


def test_the_export_thread_gives_the_gil_back_while_it_exports() -> None:
    """The export thread lets the serving loop in every few spans encoded and between batches
    (every process that exports spans relays streams too: one process, or each worker)."""
    from proxy.telemetry.otlp import release_gil

    tracing = build_tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}"})
    processor = tracing.processor
    assert isinstance(processor, BatchSpanProcessor) and isinstance(processor.exporter, OtlpSpanExporter)
    try:
        assert (processor._pause, processor.exporter._pause) == (release_gil, release_gil)
    finally:
        processor.shutdown(1.0)
