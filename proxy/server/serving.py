"""The proxy port of one serving process (the proxy alone, or one worker of a group), on
sockets already bound, and the drain that ends it.

Drain: /readyz turns 503 (`InFlightRequests.draining`) and the proxy's listening socket closes at once
(new connections are refused); requests in flight get `drain_seconds` to finish; any still
running are cancelled, which closes their client connections mid-body (cut, never cleanly
truncated).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from aiohttp import web

from proxy.config.config import Config
from proxy.dialects import DIALECTS, Dialects
from proxy.exchange.inflight import InFlightRequests
from proxy.exchange.observers import Named
from proxy.exchange.protocol import GuardedAppRunner
from proxy.exchange.record import RequestRecord
from proxy.server.app import DIRECT_KEY, create_proxy_app
from proxy.server.lifecycle import Drained, drain
from proxy.server.listen import http_url
from proxy.telemetry.accesslog import AccessLog
from proxy.telemetry.metrics import Recorder
from proxy.telemetry.spans import Spans

__all__ = ["serving"]

log = logging.getLogger("taotrace")


async def _drain(
    runner: web.AppRunner, running: InFlightRequests, deadline: float, now: asyncio.Event | None
) -> Drained:
    """Refuse new connections at once, let requests in flight run until the deadline (or until
    `now` is set: a second signal), then cancel the rest (their clients see the connection cut,
    never a clean end). aiohttp's own shutdown is not enough: it waits `shutdown_timeout`, then
    cancels only the request's body reader and waits `shutdown_timeout` again, so a stream could
    run for twice the deadline."""
    for site in list(runner.sites):
        await site.stop()
    if runner.server is not None:
        runner.server.pre_shutdown()  # idle keep-alive connections: closed, so they bring no new requests
    return await drain(running.tasks, deadline, now)


@asynccontextmanager
async def serving(
    config: Config,
    socks: Sequence[socket.socket],
    running: InFlightRequests,
    *,
    spans: Spans,
    recorder: Recorder,
    observers: Sequence[Named[RequestRecord]],
    stop_now: asyncio.Event | None = None,
    dialects: Dialects = DIALECTS,
    mirror_dropped: Callable[[str], None] = lambda reason: None,
    who: str = "",
) -> AsyncIterator[str]:
    """Forward on `socks` until the block ends, then drain; yields the proxy's URL.

    Each finished request's record goes to the spans (when this process exports them), to
    `recorder` (`Metrics`), to `observers`, and with --access-log to the access log (each serving
    process of a group logs, records and exports its own requests), in that order.
    `stop_now`: once set (a second signal), the drain cuts what runs at once. `dialects`: the APIs
    whose requests and answers are read; `mirror_dropped(reason)` counts the `--mirror` copies a
    cap refused."""
    settings = config.settings
    consumers: list[Named[RequestRecord]] = []
    if spans.exporting:  # else they are started (ids, sampling, the upstream's traceparent) and built nowhere
        consumers.append(Named("spans", spans.end))
    consumers.append(Named(recorder.sink_name, recorder.record))
    consumers.extend(observers)
    if settings.access_log:
        consumers.append(Named("access_log", AccessLog(logging.getLogger("taotrace.access"))))
    app = create_proxy_app(
        config, spans, consumers, running, recorder, mirror_dropped=mirror_dropped, dialects=dialects
    )
    runner = GuardedAppRunner(  # parse errors answered without quoting the request (secrets)
        app,
        direct=app[DIRECT_KEY],  # one catch-all route: no router per request
        handler_cancellation=True,  # a client that leaves cancels its upstream call
        access_log=None,  # aiohttp's access log prints query strings (`?key=`)
        shutdown_timeout=settings.drain_seconds,
        # aiohttp's default (3630 s) let a client hold a connection for an hour by sending half a
        # request head (slowloris); this bounds idle and unfinished connections alike.
        keepalive_timeout=settings.client_keepalive,
    )
    await runner.setup()
    try:
        for sock in socks:
            await web.SockSite(runner, sock, backlog=2048).start()
        yield http_url(*runner.addresses[0][:2])
    finally:
        running.draining = True
        drained = await _drain(runner, running, settings.drain_seconds, stop_now)
        # `who`: a group's worker names itself, so its line is not read as the whole group's.
        log.info("drain done%s: %s", f" ({who})" if who else "", drained.describe(settings.drain_seconds))
        await runner.cleanup()
