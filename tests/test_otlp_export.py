"""Spans reach a real OTLP/HTTP receiver, the console or an exporter plug-in through our batch
processor, configured by OTEL_* only (and OTEL_SDK_DISABLED turns it all off)."""

from __future__ import annotations

import asyncio
import importlib
import io
import os
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from proxy.config.settings import Settings
from proxy.serve import running
from proxy.telemetry.batch_processor import BatchSpanProcessor
from proxy.telemetry.otlp_env import span_destination
from proxy.telemetry.span_pipeline import FanOutSpanProcessor, LibrarySpanExporter
from proxy.telemetry.spans import Spans
from proxy.telemetry.tracing import Tracing, TracingError, build_tracing, resource_from_env, shutdown_tracing
from tests.fakes import FakeUpstream, OTLPSink, chat_stream, stream_handler
from tests.spanning import finish
from tests.test_span_pipeline import console_objects


async def test_phase_spans_arrive_over_otlp_http(
    upstream: FakeUpstream, client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = await OTLPSink().start()
    upstream.handler = stream_handler(chat_stream(5), first_delay=0.05, gap=0.01)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "taotrace-test")  # the SDK's Resource.create() reads the process's
    provider = build_tracing(
        {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    )
    try:
        async with running(Settings(upstream=upstream.url, port=0, metrics_port=0), tracing=provider) as srv:
            async with client.post(
                srv.proxy_url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "stream": True}
            ) as r:
                await r.read()
        await asyncio.to_thread(shutdown_tracing, provider, 5.0)
        spans = sink.spans()
        names = sorted(s.name for s in spans)  # type: ignore[attr-defined]
        assert names == ["chat gpt-4o-mini", "decode", "network", "prefill_wait"]
        root = next(s for s in spans if s.name == "chat gpt-4o-mini")  # type: ignore[attr-defined]
        assert {s.trace_id for s in spans} == {root.trace_id}  # type: ignore[attr-defined]
        attrs = {a.key for a in root.attributes}  # type: ignore[attr-defined]
        assert {"gen_ai.operation.name", "gen_ai.request.model", "gen_ai.usage.output_tokens"} <= attrs
    finally:
        await sink.close()


def test_no_endpoint_means_no_exporter() -> None:
    assert build_tracing({}).processor is None  # nothing would leave the process
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"}
    assert build_tracing(env).processor is None


def printed_to(exporter: object) -> io.StringIO:
    """Where the SDK's console exporter inside `exporter` (a LibrarySpanExporter) now prints: its
    `out` is the stdout of when the SDK was imported (pytest's, here), so a test gives it its own."""
    assert isinstance(exporter, LibrarySpanExporter) and type(exporter.exporter) is ConsoleSpanExporter
    out = exporter.exporter.out = io.StringIO()
    return out


def test_console_spans_are_printed_from_the_export_thread() -> None:
    """`OTEL_TRACES_EXPORTER=console`: the SDK's exporter, batched like OTLP (never printed on the
    event loop), one JSON object per span once flushed."""
    tracing = build_tracing({"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "60000"})
    assert isinstance(tracing.processor, BatchSpanProcessor)
    out = printed_to(tracing.processor.exporter)
    one_request(tracing)
    assert out.getvalue() == ""  # queued, not printed on the caller's thread
    assert tracing.processor.shutdown(5.0)
    printed = console_objects(out.getvalue())
    assert [obj["name"] for obj in printed] == ["network", "prefill_wait", "decode", "chat gpt-4o-mini"]


def one_request(tracing: Tracing) -> None:
    """One streamed chat request's spans, finished into `tracing`."""
    from tests.test_span_equivalence import INFO, T0, carrier, streamed

    tel = Spans(tracing, upstream_host="h", upstream_port=1, upstream_base="http://h:1")
    finish(tel, tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0), streamed())


def resources(sink: OTLPSink) -> list[dict[str, object]]:
    """Each resource the sink received spans under, as a dict of its attributes."""
    found = []
    for payload in sink.payloads:
        request = ExportTraceServiceRequest.FromString(payload)
        for rs in request.resource_spans:
            found.append({a.key: getattr(a.value, a.value.WhichOneof("value")) for a in rs.resource.attributes})
    return found


async def test_otlp_and_console_both_receive_every_span() -> None:
    """A list: one batch processor per exporter, as the SDK has; each gets every span."""
    sink = await OTLPSink().start()
    try:
        tracing = build_tracing({"OTEL_TRACES_EXPORTER": "otlp, console", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url})
        assert isinstance(tracing.processor, FanOutSpanProcessor)
        assert [type(p.exporter).__name__ for p in tracing.processor.processors] == [  # type: ignore[attr-defined]
            "OtlpSpanExporter",
            "LibrarySpanExporter",
        ]
        out = printed_to(tracing.processor.processors[1].exporter)  # type: ignore[attr-defined]
        one_request(tracing)
        one_request(tracing)
        assert await asyncio.to_thread(shutdown_tracing, tracing, 5.0)
        assert len(sink.spans()) == 8
        assert [obj["name"] for obj in console_objects(out.getvalue())].count("chat gpt-4o-mini") == 2
    finally:
        await sink.close()


@pytest.fixture
def plugin_exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """An exporter installed as a plug-in is (a zipkin's, say): a package whose entry point in
    `opentelemetry_traces_exporter` is `fakezipkin`, on sys.path. Yields what it exported."""
    module = f"fake_exporter_{os.getpid()}_{id(tmp_path)}"
    (tmp_path / f"{module}.py").write_text(
        "from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult\n"
        "EXPORTED = []\n"
        "class FakeZipkin(SpanExporter):\n"
        "    def export(self, spans):\n"
        "        EXPORTED.extend(spans)\n"
        "        return SpanExportResult.SUCCESS\n"
        "    def shutdown(self):\n"
        "        EXPORTED.append('shutdown')\n"
        "class Broken(SpanExporter):\n"
        "    def __init__(self):\n"
        "        raise RuntimeError('no endpoint configured')\n"
    )
    info = tmp_path / "fake_exporter-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-exporter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[opentelemetry_traces_exporter]\nfakezipkin = {module}:FakeZipkin\nbroken = {module}:Broken\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    exported: list[object] = importlib.import_module(module).EXPORTED
    yield exported
    sys.modules.pop(module, None)


def test_an_exporter_plugin_is_found_by_its_entry_point_as_the_sdk_finds_it(plugin_exporter: list[object]) -> None:
    """`OTEL_TRACES_EXPORTER=zipkin` (here a stand-in registered the same way) gets our spans as
    the SDK's `ReadableSpan`s; the start-up line names it."""
    tracing = build_tracing({"OTEL_TRACES_EXPORTER": "fakezipkin"})
    one_request(tracing)
    assert shutdown_tracing(tracing, 5.0)
    spans, last = plugin_exporter[:-1], plugin_exporter[-1]
    assert all(isinstance(s, ReadableSpan) for s in spans) and last == "shutdown"
    assert [s.name for s in spans] == ["network", "prefill_wait", "decode", "chat gpt-4o-mini"]  # type: ignore[attr-defined]
    assert span_destination({"OTEL_TRACES_EXPORTER": "fakezipkin"}) == (
        "spans through the fakezipkin exporter (OTEL_TRACES_EXPORTER=fakezipkin, its own settings)"
    )


def test_an_exporter_that_cannot_start_is_an_error_and_those_made_before_it_are_shut(
    plugin_exporter: list[object],
) -> None:
    with pytest.raises(
        TracingError, match=r"^OTEL_TRACES_EXPORTER=broken: the exporter could not start \(RuntimeError\)$"
    ):
        build_tracing({"OTEL_TRACES_EXPORTER": "fakezipkin,broken"})
    assert plugin_exporter == ["shutdown"]  # the one made first


@pytest.mark.parametrize(
    "env,said",
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin_nowhere"}, "OTEL_TRACES_EXPORTER names 'zipkin_nowhere', which no installed package provides"),
        ({"OTEL_TRACES_EXPORTER": "none,console"}, "OTEL_TRACES_EXPORTER lists none with other exporters"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTLP protocol 'http/json' is not supported"),
    ],
)  # fmt: skip
def test_what_cannot_be_exported_as_asked_is_an_error_never_silence(env: dict[str, str], said: str) -> None:
    with pytest.raises(TracingError, match="^" + re.escape(said)):
        build_tracing(env)


async def test_sdk_disabled_exports_nothing_and_leaves_the_callers_trace_headers_alone(
    upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    sink = await OTLPSink().start()
    tracing = build_tracing({"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url})
    assert tracing.disabled and tracing.processor is None
    caller = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "k=v"}
    try:
        async with running(Settings(upstream=upstream.url, port=0, metrics_port=0), tracing=tracing) as srv:
            for headers in (caller, {}):
                async with client.post(
                    srv.proxy_url + "/v1/chat/completions", json={"model": "m"}, headers=headers
                ) as r:
                    await r.read()
        first, second = upstream.seen
        assert (first.headers["traceparent"], first.headers["tracestate"]) == (caller["traceparent"], "k=v")
        assert "traceparent" not in second.headers and "tracestate" not in second.headers
        assert sink.payloads == []
    finally:
        await sink.close()
    assert span_destination({"OTEL_SDK_DISABLED": "true"}) == "spans not exported (OTEL_SDK_DISABLED=true)"


async def test_resource_detectors_reach_the_exported_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_EXPERIMENTAL_RESOURCE_DETECTORS through the SDK's Resource.create(); taotrace's
    service.name by default, never the command line (it may hold --ui-token or --key-salt)."""
    monkeypatch.setenv("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", "process,os,host")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")
    sink = await OTLPSink().start()
    try:
        tracing = build_tracing({**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url})
        one_request(tracing)
        assert await asyncio.to_thread(shutdown_tracing, tracing, 5.0)
    finally:
        await sink.close()
    (resource,) = resources(sink)
    assert resource["process.pid"] == os.getpid() and resource["os.type"] == "linux"
    assert resource["host.name"] == socket.gethostname()
    assert (resource["service.name"], resource["deployment.environment.name"]) == ("taotrace", "test")
    assert resource["telemetry.sdk.name"] == "taotrace"
    assert not {"process.command_line", "process.command_args"} & set(resource)


def test_the_resource_is_read_where_the_sdk_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resource.create() reads the process environment: a mapping that says otherwise is an error,
    never silently another resource."""
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-the-process")
    assert resource_from_env(os.environ).attributes["service.name"] == "from-the-process"
    with pytest.raises(ValueError, match="OTEL_SERVICE_NAME differs from the process environment's"):
        resource_from_env({"OTEL_SERVICE_NAME": "elsewhere"})


async def test_deflate_reaches_a_collector_as_deflate() -> None:
    sink = await OTLPSink().start()
    try:
        tracing = build_tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"})
        one_request(tracing)
        assert await asyncio.to_thread(shutdown_tracing, tracing, 5.0)
        assert sink.encodings == ["deflate"]
        assert len(sink.spans()) == 4
    finally:
        await sink.close()
