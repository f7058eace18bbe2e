"""A failure of the proxy's own code while relaying is `internal_error`, logged with its stack,
never recorded as the client leaving; the client sees the same cut as when it leaves.

The seam: the Forwarder's clock, a dependency passed in (the edge between our code and the OS's
time). Armed once the client has the first chunk, it raises on the relay's next read, as any
bug in the per-read sink (the phase clock, the stream's bookkeeping) would. The stream reader
is no seam for this: its exceptions are parse errors, and parsing is best effort (the request
goes on untimed), which `test_a_reader_that_raises_is_still_a_parse_error` keeps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from yarl import URL

from proxy.config.routes import Router, routes_for
from proxy.exchange.handler import Forwarder, HandlerOptions, RoutePool
from proxy.exchange.inflight import InFlightRequests
from proxy.exchange.observers import Named, Observers
from proxy.exchange.record import RequestRecord
from proxy.logs.ratelimited import RateLimitedLog
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.span_pipeline import InMemorySpanExporter, SimpleSpanProcessor
from proxy.telemetry.spans import Spans
from proxy.telemetry.tracing import Tracing
from proxy.upstream import UpstreamPool
from tests.fakes import FakeUpstream, chat_stream, sse

CANARY = "sk-canary-relay-0123456789"


class ArmedClock:
    """`time.perf_counter`, until armed: then its next call raises (once)."""

    def __init__(self) -> None:
        self.armed = False

    def __call__(self) -> float:
        if self.armed:
            self.armed = False
            raise RuntimeError(CANARY)  # a message that must never reach a log
        return time.perf_counter()


@dataclass
class Proxy:
    url: str
    records: list[RequestRecord]
    exporter: InMemorySpanExporter


@asynccontextmanager
async def forwarding(upstream: FakeUpstream, clock: Callable[[], float]) -> AsyncIterator[Proxy]:
    """A Forwarder built as app.py builds it, with `clock`, served on port 0."""
    (route,) = routes_for(upstream.url, ())
    pool = UpstreamPool(URL(upstream.url), connect_timeout=5, read_timeout=30, keepalive=4)
    exporter = InMemorySpanExporter()
    provider = Tracing(processor=SimpleSpanProcessor(exporter))
    telemetry = Spans(
        provider, upstream_host=route.host, upstream_port=route.port, upstream_base=str(route.url).rstrip("/")
    )
    records: list[RequestRecord] = []
    metrics = Metrics(CollectorRegistry())
    observers = Observers(
        [Named("spans", telemetry.end), Named("on_record", records.append)],
        metrics.sink_errors,
        RateLimitedLog(logging.getLogger("taotrace")),
    )
    forwarder = Forwarder(
        Router([(route, RoutePool(route, pool))]),
        HandlerOptions(max_body_bytes=1 << 20),
        telemetry,
        observers,
        InFlightRequests(),
        metrics.in_flight,
        clock=clock,
    )
    runner = web.ServerRunner(web.Server(forwarder.handle, handler_cancellation=True))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield Proxy(f"http://{host}:{port}", records, exporter)
    finally:
        await runner.cleanup()
        await pool.close()


async def settled(records: list[RequestRecord]) -> RequestRecord:
    for _ in range(1000):
        if records:
            return records[0]
        await asyncio.sleep(0.005)
    raise AssertionError("no record")


def two_part_stream(go_on: asyncio.Event) -> Callable[[web.Request], object]:
    frames = chat_stream(4)

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(frames[0])
        await go_on.wait()
        for frame in frames[1:]:
            await resp.write(frame)
        await resp.write_eof()
        return resp

    return handler


async def test_an_exception_in_the_relay_is_internal_error_logged_with_its_stack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    go_on = asyncio.Event()
    upstream = await FakeUpstream(two_part_stream(go_on)).start()  # type: ignore[arg-type]
    clock = ArmedClock()
    try:
        async with forwarding(upstream, clock) as proxy, aiohttp.ClientSession() as client:
            received = b""
            with caplog.at_level(logging.DEBUG, "taotrace"):
                async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                    assert r.status == 200
                    received += await r.content.readany()  # the first chunk
                    clock.armed = True
                    go_on.set()
                    # The client's connection is cut, without the terminating chunk: as when
                    # the client left, the stream never looks complete.
                    with pytest.raises(aiohttp.ClientPayloadError):
                        async for data in r.content.iter_any():
                            received += data
                record = await settled(proxy.records)
    finally:
        await upstream.close()
    assert received == chat_stream(4)[0]
    assert (record.status_code, record.error_type) == (200, "internal_error")  # was: client_abort
    (span,) = [s for s in proxy.exporter.get_finished_spans() if s.name.startswith("chat")]
    assert span.attributes is not None and span.attributes["error.type"] == "internal_error"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    line = errors[0].getMessage()
    assert "internal error while relaying" in line and "RuntimeError" in line and "in __call__" in line
    assert CANARY not in caplog.text  # the stack, never the exception's message


async def test_a_reader_that_raises_is_still_a_parse_error() -> None:
    # Parsing is best effort: a stream the reader cannot follow is forwarded whole, and the
    # request is not an error (only its timing is partial).
    frames = [b"data: {not json\n\n", *sse({"choices": [{"delta": {"content": "x"}, "finish_reason": "stop"}]})]

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame in frames:
            await resp.write(frame)
        await resp.write_eof()
        return resp

    upstream = await FakeUpstream(handler).start()
    try:
        async with forwarding(upstream, time.perf_counter) as proxy, aiohttp.ClientSession() as client:
            async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                assert await r.read() == b"".join(frames)
            record = await settled(proxy.records)
    finally:
        await upstream.close()
    assert record.error_type == ""
