"""The handler of the proxy port: send the client's request on, relay the answer, time it.

    handle      read the target and body, find the route and the dialect, start the request's
                span (the upstream's `traceparent` names it), register it as running
    _forward    send the request upstream, send the client the head, relay the body (`relay.py`)
    _mirror     `--mirror`: the same request to a second upstream, answered to nowhere
    _end        what the exchange saw (`Exchange.facts`) to the bookkeeping (`bookkeeping.py`)

The client going away cancels the handler (aiohttp `handler_cancellation=True`) and the upstream
connection is dropped, so the upstream sees it close. Once the client has the whole answer (the
stream's terminal event was written to it, or the whole body), its leaving is not an abort: many
clients close right after `data: [DONE]`. The request is recorded as it ended, timed to its last
byte written, and the upstream connection reads the rest of the body in the background to go
back to the pool (`discard_rest`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDict

from proxy.config.routes import Route, Router
from proxy.dialects import DIALECTS, Dialect, Dialects, RequestInfo, request_info
from proxy.errors import BodyTooLarge, ProxyError
from proxy.exchange.bookkeeping import Bookkeeper
from proxy.exchange.exchange import Exchange, server_timing
from proxy.exchange.headers import ForwardedFor, request_headers, response_headers
from proxy.exchange.inflight import Counted, InFlightRequests
from proxy.exchange.mirror import MirrorPolicy, mirror_headers, new_pair_id
from proxy.exchange.observers import Observers
from proxy.exchange.protocol import RelayedResponse
from proxy.exchange.record import RequestRecord
from proxy.exchange.relay import Discard, ended_by, never_paused, relay_for, relay_to_client
from proxy.exchange.target import target as target_of
from proxy.exchange.timing import PhaseClock
from proxy.exchange.tracer import Tracer
from proxy.logs.stack import stack_of
from proxy.logs.upstream_failures import UpstreamFailures
from proxy.upstream import UpstreamPool, UpstreamResponse

__all__ = ["Forwarder", "HandlerOptions", "RoutePool"]

log = logging.getLogger("taotrace")

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class RoutePool:
    """One route and the connection pool of its upstream."""

    route: Route
    pool: UpstreamPool


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerOptions:
    """What the settings say about forwarding, read once at start."""

    max_body_bytes: int
    capture_content: bool = False
    capture_io_values: bool = False  # with capture_content: the plain texts of `input.value` / `output.value`
    end_user: bool = False  # read the caller's own user id from the body (`--attribute-body-user`)
    server_timing: bool = False  # a `Server-Timing` header on the response head
    forwarded_for: ForwardedFor = "append"  # what the upstream learns of the client's address


class InFlightGauge(Protocol):
    """`taotrace_in_flight_requests{upstream, api}`."""

    def labels(self, *values: str) -> Counted: ...


class Forwarder:
    """The aiohttp handler for every path of the proxy port."""

    def __init__(
        self,
        routes: Router[RoutePool],
        options: HandlerOptions,
        tracer: Tracer[Any],
        observers: Observers[RequestRecord],
        running: InFlightRequests,
        in_flight: InFlightGauge,
        *,
        bookkeeper: Bookkeeper | None = None,
        failures: UpstreamFailures | None = None,
        mirror: tuple[MirrorPolicy, RoutePool] | None = None,
        mirror_dropped: Callable[[str], None] = lambda reason: None,
        dialects: Dialects = DIALECTS,
        clock: Clock = time.perf_counter,
    ) -> None:
        """`observers`: every consumer of a finished request's record, behind one guard;
        `running`: this process's requests in flight; `bookkeeping`: how records are made (by
        default from `options`, without attribution or prices); `failures`: the upstreams'
        failures as rate-limited warnings; `mirror`: the policy and the upstream copies go to
        (`mirror.py`), `mirror_dropped(reason)` counting a copy a cap refused."""
        self.routes = routes
        self.options = options
        self.tracer = tracer
        self.observers = observers
        self.running = running
        self.in_flight = in_flight
        self.books = bookkeeper or Bookkeeper(
            observers,
            tracer,
            running,
            clock=clock,
            capture_content=options.capture_content,
            capture_io_values=options.capture_io_values,
        )
        self.failures = failures
        self.mirror = mirror
        self.mirror_dropped = mirror_dropped
        self.dialects = dialects
        self.clock = clock

    def flush(self) -> None:
        """Record every finished request still queued (at exit, before the observers flush)."""
        self.books.flush()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        t0 = self.clock()
        routed = ""
        try:
            target = target_of(request)
            up, target = self.routes.match(target)
            routed = up.route.name
            body = await self._read_body(request)
        except ProxyError as exc:
            path = request.rel_url.raw_path
            self.books.refused(self.dialects.api_for_path(path), request.method, path, exc, t0, routed)
            return exc.response()
        path, _, query = target.partition("?")  # the path as the upstream sees it, the prefix stripped
        dialect = self.dialects.for_path(path)  # once per request: its reader then runs per event
        info = self._inspect(dialect, body)
        x = self._begin(info, request.method, path, query, request.headers, t0, up.route, dialect)
        x.counted = self.in_flight.labels(routed, info.api)
        self.running.add(x, x.counted)
        if self.mirror is not None:
            self._offer_mirror(x, request, target, body)
        try:
            return await self._forward(request, x, up.pool, target, body)
        except asyncio.CancelledError:  # the client left, or the drain deadline passed
            x.end = "drained" if self.running.draining else "client_left"
            raise
        except ConnectionError:  # writing to a client that had gone
            x.end = "client_left"
            raise
        except Exception:  # a failure of our own: aiohttp logs it, and answers 500 if it still can
            x.end = "internal"
            if not x.head_sent:
                x.status = 500
            raise
        finally:
            self._end(x)

    def _inspect(self, dialect: Dialect | None, body: bytes) -> RequestInfo:
        """What the request body says (model, stream, parameters, captured content)."""
        if dialect is None:
            return request_info(None, body)
        options = self.options
        try:
            return dialect.inspect(
                body,
                capture_content=options.capture_content,
                end_user=options.end_user,
                io_values=options.capture_io_values,
            )
        except Exception as exc:  # noqa: BLE001 - a dialect's bug (a plug-in's): the request goes unread
            self.observers.failed("record", exc)
            return dialect.unread()

    def _begin(
        self,
        info: RequestInfo,
        method: str,
        path: str,
        query: str,
        carrier: Mapping[str, str],
        t0: float,
        route: Route,
        dialect: Dialect | None,
        links: tuple[Any, ...] = (),
    ) -> Exchange:
        """The exchange of one request (or copy), its root span started."""
        tracer = self.tracer
        try:
            span = tracer.start(info, method, path, query, carrier, t0, route, links)
        except Exception as exc:  # noqa: BLE001 - counted and logged under spans: telemetry never breaks a request
            self.observers.failed("spans", exc)
            span = tracer.untraced
        return Exchange(
            method, path, info, PhaseClock(t0), span, carrier, route, dialect,
            trace_id_of=tracer.trace_id, task=asyncio.current_task(),
        )  # fmt: skip

    def _end(self, x: Exchange) -> None:
        """What `x` saw, to the bookkeeping; its upstream connection released, and it no longer runs."""
        try:
            facts = x.facts()
        except Exception as exc:  # noqa: BLE001 - a bug of ours: the rest must still run
            self.observers.failed("record", exc)  # counted and logged; the request goes unrecorded
            facts = None
        x.release_upstream()
        self.running.discard(x, x.counted)
        if facts is not None:
            self.books.later(x, facts)

    async def _send(
        self, x: Exchange, pool: UpstreamPool, target: str, headers: CIMultiDict[str], body: bytes
    ) -> UpstreamResponse:
        """The request upstream, with our span's context; raises the proxy's own `ProxyError`."""
        self.tracer.inject(x.span, headers)
        upstream = await pool.request(x.method, x.route.base_path + target, headers.items(), body, x.phase)
        x.upstream = upstream
        x.phase.headers(self.clock())
        x.status = upstream.status
        return upstream

    async def _forward(
        self, request: web.BaseRequest, x: Exchange, pool: UpstreamPool, target: str, body: bytes
    ) -> web.StreamResponse:
        """Send the request upstream and relay its answer; what happens is noted on `x`."""
        options = self.options
        headers = request_headers(request.headers.items(), request.remote, options.forwarded_for)
        try:
            upstream = await self._send(x, pool, target, headers, body)
        except ProxyError as error:  # our own 502/504, never bytes from the wire
            x.status, x.refused = error.status, error.error_type
            log.debug("upstream request failed: %s", error.message)
            if self.failures is not None and not self.running.draining:  # draining: our own doing
                self.failures.before_head(x.route, error)
            return error.response()
        head = response_headers(upstream.headers)
        if options.server_timing:
            head.add("Server-Timing", server_timing(x.phase))  # beside the upstream's own, if any
        response = RelayedResponse(status=x.status, reason=upstream.reason, headers=head)
        writer = await response.prepare(request)  # the head waits in the writer: `Relay.start` sends it
        assert writer is not None
        x.head_sent = True
        chunked = response.headers.get("Transfer-Encoding", "").lower() == "chunked"  # aiohttp's choice
        x.relay = relay_for(
            request.transport, chunked, self.clock, x.phase, x.dialect, upstream, options.capture_content
        )
        failures, route = self.failures, x.route
        on_cut = None if failures is None else lambda exc: failures.in_body(route, exc)
        x.end = await relay_to_client(x.relay, upstream, request, response, writer, on_cut)
        return response

    def _offer_mirror(self, x: Exchange, request: web.BaseRequest, target: str, body: bytes) -> None:
        """Start a copy beside the request when the policy says so; never awaited by the handler."""
        assert self.mirror is not None
        policy, to = self.mirror
        try:
            refused = policy.offer(x.path, x.route.name)
            if refused:
                if refused in ("per_minute", "concurrency"):
                    self.mirror_dropped(refused)
                return
            x.pair_id = new_pair_id()
            headers = mirror_headers(request.headers.items(), policy.key)
            asyncio.ensure_future(self._mirror(policy, to, x, target, body, headers))
        except Exception:  # a copy must never break the request
            log.exception("could not start a mirror copy")

    async def _mirror(
        self,
        policy: MirrorPolicy,
        to: RoutePool,
        primary: Exchange,
        target: str,
        body: bytes,
        headers: CIMultiDict[str],
    ) -> None:
        """The copy: the same body to the mirror upstream, its answer read to the end and dropped,
        recorded with the request's pair id; its span links to the request's."""
        query = target.partition("?")[2]
        link = primary.span.get_span_context()
        x = self._begin(
            primary.info, primary.method, primary.path, query, {}, self.clock(), to.route, primary.dialect, (link,)
        )
        x.pair_id, x.mirror = primary.pair_id, True
        self.running.add(x)  # not a client's request: not in the in-flight gauge
        try:
            upstream = await self._send(x, to.pool, target, headers, body)
            x.relay = relay_for(
                Discard(), False, self.clock, x.phase, x.dialect, upstream, self.options.capture_content
            )
            await upstream.relay(x.relay, never_paused)
        except ProxyError as error:
            x.status, x.refused = error.status, error.error_type
        except asyncio.CancelledError:
            x.end = "drained"
            raise
        except Exception as exc:  # noqa: BLE001 - noted as how it ended (and logged when it is ours)
            x.end = ended_by(x.relay, exc) if x.relay is not None else "internal"
            if x.relay is None:
                log.error("internal error in a mirror copy:\n%s", stack_of(exc))
        finally:
            policy.done()
            self._end(x)

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        limit = self.options.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise BodyTooLarge(
                f"request body of {request.content_length} bytes exceeds the proxy's limit of {limit} bytes (TAOTRACE_MAX_BODY_BYTES)"
            )
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLarge(
                f"request body exceeds the proxy's limit of {limit} bytes (TAOTRACE_MAX_BODY_BYTES)"
            ) from None
