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
from dataclasses import dataclass, field
from typing import Any

from aiohttp import hdrs, web

from proxy.accounting.config import Accounting
from proxy.config.envproxy import forward_proxy_for
from proxy.config.routes import Route, Router, routes_for
from proxy.config.settings import Settings, upstream_url
from proxy.dialects import DIALECTS, Dialects
from proxy.exchange.forward import Forwarder, Observer, Upstream
from proxy.exchange.inflight import InFlightRequests
from proxy.exchange.mirror import MirrorPolicy
from proxy.exchange.record import RequestRecord
from proxy.logs.ratelimited import RateLimitedLog, flushing
from proxy.logs.upstream_failures import UpstreamFailures
from proxy.reporting.sinks import Named
from proxy.server.hints import DoubledPrefix
from proxy.telemetry.exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, wants_openmetrics
from proxy.telemetry.metrics import Recorder
from proxy.telemetry.spans import Telemetry
from proxy.ui import LiveView, add_ui_routes
from proxy.upstream import UpstreamPool

__all__ = ["DIRECT_KEY", "ServerState", "create_metrics_app", "create_proxy_app", "make_pool", "upstream_url"]


@dataclass
class ServerState:
    """Shared by both apps: whether a drain has begun (then /readyz says 503), and the proxy
    handler tasks in flight (the drain waits for them, then cancels those left at its deadline)."""

    draining: bool = False
    in_flight: set[asyncio.Task[Any]] = field(default_factory=set)
    requests: InFlightRequests = field(default_factory=InFlightRequests)  # what they are doing, for the live view


STATE_KEY = web.AppKey("state", ServerState)
UPSTREAMS_KEY = web.AppKey("upstreams", tuple[Upstream, ...])
# The proxy's handler of every request, for a runner that skips the router (`GuardedAppRunner`).
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
DIRECT_KEY: web.AppKey[Handler] = web.AppKey("direct")


def make_pool(settings: Settings, environ: Mapping[str, str] = os.environ, *, url: str | None = None) -> UpstreamPool:
    """The connections to one upstream (`url`, default `--upstream`), configured for long streams
    and byte-exact forwarding; through the forward proxy `HTTPS_PROXY` / `HTTP_PROXY` name unless
    `NO_PROXY` says otherwise (decided per upstream host)."""
    upstream = upstream_url(settings.upstream if url is None else url)
    return UpstreamPool(
        upstream,
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        keepalive=settings.upstream_keepalive,
        max_connections=settings.max_connections,  # 0: no hidden cap on concurrent streams
        discard_bytes=settings.upstream_discard_bytes,
        discard_seconds=settings.upstream_discard_seconds,
        forward_proxy=forward_proxy_for(upstream, environ),
    )


def mirror_policy(settings: Settings, environ: Mapping[str, str] = os.environ) -> MirrorPolicy | None:
    """`--mirror`'s policy from the settings (None: off); the mirror's key read from the
    variable `--mirror-key-env` names."""
    if settings.mirror is None or settings.mirror_ratio is None or settings.mirror_max_per_minute is None:
        return None
    return MirrorPolicy(
        route=settings.mirror.lower(),
        ratio=settings.mirror_ratio,
        per_minute=settings.mirror_max_per_minute,
        concurrency=settings.mirror_concurrency,
        paths=tuple(settings.mirror_paths),
        key=environ.get(settings.mirror_key_env) if settings.mirror_key_env else None,
        clock=time.monotonic,
    )


def mirror_for(
    settings: Settings, upstreams: Sequence[Upstream], environ: Mapping[str, str]
) -> tuple[MirrorPolicy, Upstream] | None:
    policy = mirror_policy(settings, environ)
    if policy is None:
        return None
    return policy, next(u for u in upstreams if u.route.name == policy.route)


def create_proxy_app(
    settings: Settings,
    telemetry: Telemetry,
    metrics: Recorder,
    state: ServerState,
    observers: Sequence[Observer | Named[RequestRecord]] = (),
    accounting: Accounting | None = None,
    mirror_dropped: Callable[[str], None] = lambda reason: None,
    environ: Mapping[str, str] = os.environ,
    dialects: Dialects = DIALECTS,
) -> web.Application:
    """The proxy: one catch-all route; the port reserves no path of its own.

    Call it on the loop that will serve the app (the upstream pools are bound to it): one pool
    per route (`--route`), the route for `/` being `--upstream` unless a route claims it. With
    `--mirror`, copies go to that route's pool; `mirror_dropped(reason)` counts those a cap refused.
    `dialects`: the APIs whose requests and answers are read (every other path is `other`)."""
    routes = routes_for(settings.upstream, settings.routes)
    app = web.Application(client_max_size=settings.max_body_bytes, handler_args={"max_field_size": 16384})
    app[STATE_KEY] = state
    upstreams = app[UPSTREAMS_KEY] = tuple(Upstream(r, make_pool(settings, environ, url=str(r.url))) for r in routes)

    async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
        yield
        copies = list(forwarder.mirrors)  # no client waits for them: cancelled, not drained
        for task in copies:
            task.cancel()
        await asyncio.gather(*copies, return_exceptions=True)
        forwarder.flush()  # records still queued (see `Finishing`), before the sinks flush at exit
        await asyncio.gather(*(u.pool.close() for u in upstreams))

    warnings = RateLimitedLog(logging.getLogger("taotrace"))

    async def warnings_ctx(app: web.Application) -> AsyncIterator[None]:
        async with flushing(warnings):  # counts held back are logged as their interval ends
            yield

    forwarder = Forwarder(
        Router([(u.route, u) for u in upstreams]),
        telemetry,
        metrics,
        max_body_bytes=settings.max_body_bytes,
        capture_content=settings.capture_content,
        capture_io_values=settings.capture_io_values,
        observers=observers,
        is_draining=lambda: state.draining,
        server_timing=settings.server_timing,
        forwarded_for=settings.forwarded_for,
        attributor=accounting.attributor if accounting is not None else None,
        prices=accounting.prices if accounting is not None else None,
        running=state.requests if settings.ui else None,  # without the view, not even a set add
        failures=UpstreamFailures(warnings, environ),
        warnings=warnings,
        mirror=mirror_for(settings, upstreams, environ),
        mirror_dropped=mirror_dropped,
        dialects=dialects,
    )
    app.cleanup_ctx.append(pool_ctx)
    app.cleanup_ctx.append(warnings_ctx)
    forward = forwarder.handle
    in_flight = state.in_flight
    root: Route = next(r for r in routes if r.prefix == "")
    doubled = DoubledPrefix(root.url, logging.getLogger("taotrace"))

    async def tracked(request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        if doubled.watching:  # the first requests only
            doubled.see(request.path, request.host)
        in_flight.add(task)
        try:
            return await forward(request)
        finally:
            in_flight.discard(task)

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
# switch intervals, and ~1,000 pieces at the model cap cost well under a millisecond in all
# when few of them changed).
RENDER_SLICE_SECONDS = 0.0002
WRITE_PIECE_BYTES = 256 * 1024  # what one write hands the socket: a page of 13 MB is ~50 writes


async def render_page(pages: Pages, openmetrics: bool, clock: Callable[[], float] = time.perf_counter) -> list[bytes]:
    """Every piece of the page, yielding to the loop every `RENDER_SLICE_SECONDS` of rendering."""
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
    live: LiveView | None = None,
    *,
    ui_token: str | None = None,
    trace_url: str = "",
    proxy_port: int = 0,
) -> web.Application:
    """`/metrics` (text, or OpenMetrics with exemplars by `Accept`), `/healthz`, `/readyz`, and
    the live view when one is given (`proxy/ui/`). Any other path gets a JSON 404 saying this is
    not the proxy's port (`proxy_port`, when known): an SDK given this port by mistake says so.

    `readiness()` says "ready" (200) or why not, e.g. "draining" (503).
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
            pending = rendering[openmetrics] = asyncio.ensure_future(render_page(pages, openmetrics))
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
        add_ui_routes(app, live, token=ui_token, trace_url=trace_url)
    return app
