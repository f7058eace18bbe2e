"""The exporters' own records about a failing collector become rate-limited lines of ours; the
loggers it filters are still where the installed SDK logs."""

from __future__ import annotations

import asyncio
import importlib
import logging
import socket

import pytest
from aiohttp import web

from proxy.logs.origin import origin
from proxy.telemetry.batch_processor import BatchSpanProcessor
from proxy.telemetry.collector_log import LOGGERS, collector_warnings, endpoints_from
from proxy.telemetry.otlp_env import export_settings
from proxy.telemetry.span_exporter import OtlpSpanExporter
from proxy.telemetry.span_pipeline import SimpleSpanProcessor
from tests.test_telemetry_otlp import span


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exporter(env: dict[str, str]) -> OtlpSpanExporter:
    settings = export_settings(env, "traces")
    assert settings is not None
    return OtlpSpanExporter(settings)


def ours(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "taotrace"]


def theirs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name != "taotrace" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("name", sorted(LOGGERS))
def test_each_filtered_logger_is_still_a_module_logging_under_its_name(name: str) -> None:
    """A module renamed would let its raw lines through again: fail here first."""
    module = importlib.import_module(name)
    loggers = [v for k, v in vars(module).items() if k in ("_logger", "logger", "log")]
    assert any(isinstance(lg, logging.Logger) and lg.name == name for lg in loggers), name


def test_endpoints_are_named_by_origin_only() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://user:secret@collector.example:4318/base?key=k"}
    assert endpoints_from(env) == {
        "traces": "https://collector.example:4318",
        "metrics": "https://collector.example:4318",
    }
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    assert endpoints_from(env) == {"traces": "collector:4317"}
    assert endpoints_from({}) == {}
    assert origin("http://[::1]:4318/v1/traces") == "http://[::1]:4318"


async def test_a_collector_answering_503_is_named_with_its_status(caplog: pytest.LogCaptureFixture) -> None:
    async def unavailable(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=503)

    app = web.Application()
    app.router.add_post("/v1/traces", unavailable)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = "http://127.0.0.1:%d" % runner.addresses[0][1]
    # 0.5 s: shorter than the first back-off, so each export fails after one attempt
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": base, "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5"}
    processor = SimpleSpanProcessor(exporter(env))
    try:
        with caplog.at_level(logging.DEBUG):
            async with collector_warnings({"OTEL_EXPORTER_OTLP_ENDPOINT": base}, logging.getLogger("taotrace")):
                for _ in range(2):  # two failed exports: one line
                    await asyncio.to_thread(processor.on_end, span())
    finally:
        await runner.cleanup()
    line = f"OTLP export to {base} failed: HTTP 503 Service Unavailable; requests are not affected"
    assert len(ours(caplog)) == 2 and ours(caplog)[0].startswith(line), caplog.text
    assert ours(caplog)[1].startswith(line) and " more in the last " in ours(caplog)[1]  # the count, at exit
    assert theirs(caplog) == []


async def test_a_full_span_queue_is_one_line_and_other_records_pass(caplog: pytest.LogCaptureFixture) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    processor = BatchSpanProcessor(
        exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5"}),  # no retry
        max_queue_size=2,
        max_export_batch_size=2,
        schedule_delay=60.0,
    )
    with caplog.at_level(logging.DEBUG):
        async with collector_warnings({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, logging.getLogger("taotrace")):
            for _ in range(10):  # some dropped while the first batch fails, each a "Queue full" record
                processor.on_end(span())
            # Not about exporting: passes untouched.
            logging.getLogger("proxy.telemetry.span_exporter").warning("Unsupported thing")
            await asyncio.to_thread(processor.shutdown, 5.0)
    assert ours(caplog)[0].startswith(f"the span queue is full: spans are dropped (the collector {endpoint} ")
    full = [m for m in ours(caplog) if m.startswith("the span queue is full")]
    assert len([m for m in full if " more in the last " not in m]) == 1, full  # then only counts
    assert any(m.startswith(f"OTLP export to {endpoint} failed: connection refused;") for m in ours(caplog))
    assert theirs(caplog) == ["Unsupported thing"]
    # Once closed, ours pass again; a library exporter's late records about exporting (a retry
    # given up on at the bounded shutdown) are dropped, said by the exit line already.
    logging.getLogger("proxy.telemetry.batch_processor").warning("Queue full, dropping %s.", "span")
    assert theirs(caplog)[-1] == "Queue full, dropping span."
    logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter").warning(
        "Shutdown in progress, aborting retry."
    )
    assert theirs(caplog)[-1] == "Queue full, dropping span."
