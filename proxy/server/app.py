"""The two aiohttp applications: the proxy (every path forwarded) and the metrics port.

`create_proxy_app` owns the upstream connection pools (`proxy.upstream`, one per route) through
`cleanup_ctx`. Their shape: no total timeout (streams run for minutes), connect and idle-read
timeouts instead, no pool cap by default, no cookies, no decompression, no invented headers, and
a keep-alive shorter than the upstream's idle timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from aiohttp import hdrs, web

from proxy.config.config import Config
from proxy.config.routes import Route, Router
from proxy.config.settings import Settings
from proxy.dialects import DIALECTS, Dialects
from proxy.exchange.bookkeeping import Bookkeeper
from proxy.exchange.handler import Forwarder, HandlerOptions, InFlightGauge, RoutePool
from proxy.exchange.inflight import InFlightRequests
from proxy.exchange.mirror import MirrorPolicy
from proxy.exchange.observers import ErrorCounts, Named, Observers
from proxy.exchange.record import RequestRecord
from proxy.exchange.tracer import Tracer
from proxy.logs.ratelimited import RateLimitedLog, flushing
from proxy.logs.upstream_failures import UpstreamFailures
from proxy.server.hints import DoubledPrefix
from proxy.telemetry.exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, wants_openmetrics
from proxy.ui import add_ui_routes
from proxy.ui.live import LiveSource
from proxy.upstream import UpstreamPool

__all__ = [
    "DIRECT_KEY",
    "ProxyMetrics",
    "create_metrics_app",
    "create_proxy_app",
    "handler_options",
    "make_pool",
    "mirror_policy",
]


class ProxyMetrics(Protocol):
    """What the proxy port counts itself (the rest comes from records): requests in flight, and
    the observers' failures (`proxy.telemetry.metrics.Metrics`)."""

    @property
    def in_flight(self) -> InFlightGauge: ...

    @property
    def sink_errors(self) -> ErrorCounts: ...


UPSTREAMS_KEY = web.AppKey("upstreams", tuple[RoutePool, ...])
# The proxy's handler of every request, for a runner that skips the router (`GuardedAppRunner`).
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
DIRECT_KEY: web.AppKey[Handler] = web.AppKey("direct")


def make_pool(config: Config, route: Route) -> UpstreamPool:
    """The connections to one route's upstream, configured for long streams and byte-exact
    forwarding; through the forward proxy the environment names for it (`config.forward`)."""
    s = config.settings
    return UpstreamPool(
        route.url,
        connect_timeout=s.connect_timeout,
        read_timeout=s.read_timeout,
        keepalive=s.upstream_keepalive,
        max_connections=s.max_connections,  # 0: no hidden cap on concurrent streams
        discard_bytes=s.upstream_discard_bytes,
        discard_seconds=s.upstream_discard_seconds,
        forward_proxy=config.forward_proxy(route),
    )


def mirror_policy(config: Config) -> MirrorPolicy | None:
    """`--mirror`'s policy (None: off)."""
    s = config.settings
    if s.mirror is None or s.mirror_ratio is None or s.mirror_max_per_minute is None:
        return None
    return MirrorPolicy(
        route=s.mirror.lower(),
        ratio=s.mirror_ratio,
        per_minute=s.mirror_max_per_minute,
        concurrency=s.mirror_concurrency,
        paths=tuple(s.mirror_paths),
        key=config.mirror_key,
        clock=time.monotonic,
    )


def handler_options(settings: Settings) -> HandlerOptions:
    """What the handler needs of the settings, read once."""
    return HandlerOptions(
        max_body_bytes=settings.max_body_bytes,
        capture_content=settings.capture_content,
        capture_io_values=settings.capture_io_values,
        end_user=settings.attribute_body_user,
        server_timing=settings.server_timing,
        forwarded_for=settings.forwarded_for,
    )


def create_proxy_app(
    config: Config,
    tracer: Tracer[Any],
    observers: Sequence[Named[RequestRecord]],
    running: InFlightRequests,
    metrics: ProxyMetrics,
    *,
    mirror_dropped: Callable[[str], None] = lambda reason: None,
    environ: Mapping[str, str] = os.environ,
    dialects: Dialects = DIALECTS,
) -> web.Application:
    """The proxy: one catch-all route; the port reserves no path of its own.

    Call it on the loop that will serve the app (the upstream pools are bound to it): one pool
    per route. `observers`: every consumer of a finished request's record, each behind the one
    guard (`Observers`: failures counted in `metrics.sink_errors`); `running`: this process's
    requests in flight. With `--mirror`, copies go to that route's pool; `mirror_dropped(reason)`
    counts those a cap refused. `dialects`: the APIs whose requests and answers are read."""
    settings = config.settings
    app = web.Application(client_max_size=settings.max_body_bytes, handler_args={"max_field_size": 16384})
    upstreams = app[UPSTREAMS_KEY] = tuple(RoutePool(r, make_pool(config, r)) for r in config.routes)

    async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
        yield
        copies = running.mirror_tasks()  # no client waits for them: cancelled, not drained
        for task in copies:
            task.cancel()
        await asyncio.gather(*copies, return_exceptions=True)
        forwarder.flush()  # records still queued (see `Finishing`), before the observers flush at exit
        await asyncio.gather(*(u.pool.close() for u in upstreams))

    warnings = RateLimitedLog(logging.getLogger("taotrace"))

    async def warnings_ctx(app: web.Application) -> AsyncIterator[None]:
        async with flushing(warnings):  # counts held back are logged as their interval ends
            yield

    # Each finished record to every observer in turn, each in its own guard; a failing one is
    # counted and logged (rate-limited); "record" and "spans" guard building the record itself.
    guarded = Observers(list(observers), metrics.sink_errors, warnings, more=("spans", "record"))
    accounting = config.accounting
    books = Bookkeeper(
        guarded,
        tracer,
        running,
        capture_content=settings.capture_content,
        capture_io_values=settings.capture_io_values,
        attributor=accounting.attributor,
        prices=accounting.prices,
    )
    policy = mirror_policy(config)
    forwarder = Forwarder(
        Router([(u.route, u) for u in upstreams]),
        handler_options(settings),
        tracer,
        guarded,
        running,
        metrics.in_flight,
        bookkeeper=books,
        failures=UpstreamFailures(warnings, config.forward_proxy),
        mirror=None if policy is None else (policy, next(u for u in upstreams if u.route.name == policy.route)),
        mirror_dropped=mirror_dropped,
        dialects=dialects,
    )
    app.cleanup_ctx.append(pool_ctx)
    app.cleanup_ctx.append(warnings_ctx)
    forward = forwarder.handle
    tasks = running.tasks
    doubled = DoubledPrefix(config.root.url, logging.getLogger("taotrace"))

    async def tracked(request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        if doubled.watching:  # the first requests only
            doubled.see(request.path, request.host)
        tasks.add(task)
        try:
            return await forward(request)
        finally:
            tasks.discard(task)

    route = app.router.add_route("*", "/{tail:.*}", tracked)

    async def direct(request: web.BaseRequest) -> web.StreamResponse:
        """`tracked`, without the router: what the router did first (the one thing it did that
        the proxy needs) is answering `Expect: 100-continue`, as the route would."""
        if request.headers.get(hdrs.EXPECT):
            refused = await route.handle_expect_header(request)  # type: ignore[arg-type]
            await request.writer.drain()
            if refused is not None:
                return refused
        return await tracked(request)  # type: ignore[arg-type]

    app[DIRECT_KEY] = direct
    return app


Pages = Callable[[bool], Iterable[bytes]]  # openmetrics? -> the /metrics page, piece by piece
# A scrape renders on the event loop, giving it back at least this often: any stream's next
# chunk waits at most about this long for a scrape (a thread would keep the GIL for whole
# switch intervals, and the pieces whose children did not change cost next to nothing).
RENDER_SLICE_SECONDS = 0.0002
WRITE_PIECE_BYTES = 256 * 1024  # what one write hands the socket: a page of 13 MB is ~50 writes


async def render_page(
    pages: Pages,
    openmetrics: bool,
    clock: Callable[[], float] = time.perf_counter,
    refresh: Callable[[], Awaitable[None]] | None = None,
) -> list[bytes]:
    """Every piece of the page (after `refresh`), yielding to the loop every
    `RENDER_SLICE_SECONDS` of rendering."""
    if refresh is not None:
        await refresh()
    out: list[bytes] = []
    deadline = clock() + RENDER_SLICE_SECONDS
    for piece in pages(openmetrics):
        out.append(piece)
        if clock() >= deadline:
            await asyncio.sleep(0)
            deadline = clock() + RENDER_SLICE_SECONDS
    return out


def create_metrics_app(
    pages: Pages,
    readiness: Callable[[], str],
    live: LiveSource | None = None,
    *,
    ui_token: str | None = None,
    proxy_port: int = 0,
    refresh: Callable[[], Awaitable[None]] | None = None,
) -> web.Application:
    """`/metrics` (text, or OpenMetrics with exemplars by `Accept`), `/healthz`, `/readyz`, and
    the live view when one is given (`proxy/ui/`). Any other path gets a JSON 404 saying this is
    not the proxy's port (`proxy_port`, when known): an SDK given this port by mistake says so.

    `readiness()` says "ready" (200) or why not, e.g. "draining" (503). `refresh`, when given, is
    awaited before each render (a group's supervisor asks its workers for their latest counts).
    """

    rendering: dict[bool, asyncio.Future[list[bytes]]] = {}  # format -> the render in progress

    def _done(openmetrics: bool, fut: asyncio.Future[list[bytes]]) -> None:
        if rendering.get(openmetrics) is fut:
            del rendering[openmetrics]

    async def metrics_handler(request: web.Request) -> web.StreamResponse:
        openmetrics = wants_openmetrics(request.headers.get("Accept", ""))
        # Scrapes that arrive while one renders share its result: ten scrapers cost one render.
        pending = rendering.get(openmetrics)
        if pending is None:
            pending = rendering[openmetrics] = asyncio.ensure_future(render_page(pages, openmetrics, refresh=refresh))
            pending.add_done_callback(lambda fut: _done(openmetrics, fut))
        pieces = await asyncio.shield(pending)  # one scraper giving up must not cancel the others' render
        ctype = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        size = sum(map(len, pieces))
        if size <= WRITE_PIECE_BYTES or request.method == "HEAD":
            return web.Response(body=b"".join(pieces), headers={"Content-Type": ctype})
        # A big page leaves in pieces, each write waiting for the client to take the last: the
        # loop copies ~256 KB into the socket at a time instead of 13 MB at once.
        response = web.StreamResponse(headers={"Content-Type": ctype})
        response.content_length = size
        await response.prepare(request)
        batch: list[bytes] = []
        held = 0
        for piece in pieces:
            batch.append(piece)
            held += len(piece)
            if held >= WRITE_PIECE_BYTES:
                await response.write(b"".join(batch))
                batch, held = [], 0
        if batch:
            await response.write(b"".join(batch))
        await response.write_eof()
        return response

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        state = readiness()
        return web.Response(status=200 if state == "ready" else 503, text=state + "\n")

    where = f" (port {proxy_port})" if proxy_port else ""
    message = f"taotrace: this is the metrics and live view port; send API requests to the proxy's port{where}"
    wrong_port = {"error": {"message": message, "type": "not_found", "code": "not_found"}}

    @web.middleware
    async def not_here(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        # Only the router's own 404 (no route has this path): its 405s keep their `Allow`.
        if isinstance(request.match_info.http_exception, web.HTTPNotFound):
            return web.json_response(wrong_port, status=404)
        return await handler(request)

    app = web.Application(middlewares=[not_here])
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if live is not None:
        add_ui_routes(app, live, token=ui_token)
    return app
