"""Spans reach a real OTLP/HTTP receiver (or the console) through our batch processor, configured by OTEL_* only."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from proxy.config.settings import Settings
from proxy.serve import running
from proxy.telemetry.spans import Telemetry
from proxy.telemetry.tracing import build_tracing, shutdown_tracing
from tests.fakes import FakeUpstream, OTLPSink, chat_stream, stream_handler
from tests.spanning import finish


async def test_phase_spans_arrive_over_otlp_http(upstream: FakeUpstream, client: aiohttp.ClientSession) -> None:
    sink = await OTLPSink().start()
    upstream.handler = stream_handler(chat_stream(5), first_delay=0.05, gap=0.01)
    provider = build_tracing(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "taotrace-test",
        }
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


def test_console_spans_are_printed_from_the_export_thread(capsys: pytest.CaptureFixture[str]) -> None:
    """`OTEL_TRACES_EXPORTER=console`: batched like OTLP (never printed on the event loop), one
    JSON line per span once flushed."""
    from proxy.telemetry.batch_processor import BatchSpanProcessor
    from tests.test_span_equivalence import INFO, T0, carrier, streamed

    tracing = build_tracing({"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "60000"})
    assert isinstance(tracing.processor, BatchSpanProcessor)
    tel = Telemetry(tracing, upstream_host="h", upstream_port=1, upstream_base="http://h:1")
    finish(tel, tel.start(INFO, "POST", "/v1/chat/completions", "", carrier(), T0), streamed())
    assert capsys.readouterr().out == ""  # queued, not printed on the caller's thread
    assert tracing.processor.shutdown(5.0)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["name"] for line in lines] == ["network", "prefill_wait", "decode", "chat gpt-4o-mini"]
