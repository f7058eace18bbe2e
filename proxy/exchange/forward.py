"""The handler of the proxy port: send the client's request on, relay the answer, time it.

Bytes go to the client first: each read from the upstream is written to the client inside the
upstream connection's `data_received` (`proxy/upstream.py`), then timestamped and parsed on the
same immutable bytes; parsing can never fail the request. The client going away cancels the
handler (aiohttp `handler_cancellation=True`) and we drop the upstream connection, so the
upstream sees it close; the upstream dying mid-body closes the client's connection without the
terminating chunk, so a cut stream never looks complete.

Once the client has the whole answer (the stream's terminal event was written to it, or the
whole body), its leaving is not an abort: many clients close right after `data: [DONE]`. The
request is recorded as it ended, timed to its last byte written, and the upstream connection
reads the rest of the body in the background to go back to the pool (`discard_rest`).

A request's bookkeeping (its record, span, metrics, live view: `_finish`) is not done on the
handler's step that ends it but queued, and the queue drained one record per turn of the event
loop (`Finishing`): when many streams end together, each one's bookkeeping used to run before
the next stream's last bytes, already readable, were read and relayed (the last token stamped
+4.1 ms late at p95 with 32 streams). Every instant a record holds is taken before it is queued.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDict

from proxy.accounting.attribution import Attributor
from proxy.accounting.prices import Cost, PriceTable, cost_of
from proxy.accounting.ratelimits import read_rate_limits
from proxy.config.routes import Route, Router
from proxy.dialects import DIALECTS, Dialect, Dialects, RequestInfo, StreamReader, Usage, is_chunk, request_info
from proxy.dialects.sse import SSEDecoder
from proxy.errors import BadTarget, BodyFailure, BodyTooLarge, ErrorType, ProxyError
from proxy.exchange.headers import ForwardedFor, request_headers, response_headers
from proxy.exchange.inflight import InFlight, InFlightRequests
from proxy.exchange.mirror import MirrorPolicy, mirror_headers, new_pair_id
from proxy.exchange.outcome import End, Facts, Outcome, decide
from proxy.exchange.record import RequestRecord, Traced, usage_of
from proxy.exchange.timing import PhaseClock
from proxy.logs.ratelimited import RateLimitedLog
from proxy.logs.stack import stack_of
from proxy.logs.upstream_failures import UpstreamFailures
from proxy.reporting.sinks import Named, Sinks
from proxy.server.protocol import RelayedResponse
from proxy.telemetry.metrics import Recorder
from proxy.telemetry.spans import NOT_TRACED, RootSpan, Telemetry
from proxy.upstream import UpstreamPool, UpstreamResponse
from proxy.upstream.tcpinfo import TcpInfo, TcpStats, request_stats

__all__ = ["Forwarder", "Upstream"]

log = logging.getLogger("taotrace")

Clock = Callable[[], float]
Observer = Callable[[RequestRecord], None]

_UNTRACED = Traced()

MAX_BODY_COPY = 4 << 20  # a non-streaming body is kept (for its usage) up to this size
MAX_ERROR_COPY = 64 << 10
HIGH_WATER = 256 << 10  # client send buffer above this: stop reading the upstream until it drains
LOW_WATER = 64 << 10
RING_CONTENT_LIMIT = 64 << 10  # captured input kept on a record (the live view's ring holds 1,000 of them)
DRAIN_POLL = 0.005


class _ClientGone(Exception):
    pass


class Finishing:
    """Requests' bookkeeping, queued and done one request per turn of the event loop.

    `add` queues a callable and, if none is scheduled, a drain with `loop.call_soon`; each drain
    runs one and schedules the next while any are left. A `call_soon` from a loop callback runs
    only after the loop has polled its sockets again, so bytes that became readable meanwhile on
    other connections are read and relayed before the next request's bookkeeping (~45 us each).
    Past `backlog` queued, a drain also runs the excess: under a burst that never lets the loop
    idle, the queue stays bounded and a record is late by at most that many turns. `flush` runs what is left (at exit).
    """

    __slots__ = ("_backlog", "_queue", "_scheduled")

    def __init__(self, backlog: int = 64) -> None:
        self._queue: deque[Callable[[], None]] = deque()
        self._scheduled = False
        self._backlog = backlog

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, work: Callable[[], None]) -> None:
        """Run `work` on a later turn of the running loop (after its next poll of sockets)."""
        self._queue.append(work)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        queue = self._queue
        try:
            if queue:  # empty after a `flush`
                queue.popleft()()
            while len(queue) > self._backlog:
                queue.popleft()()
        finally:
            if queue:
                asyncio.get_running_loop().call_soon(self._drain)
            else:
                self._scheduled = False

    def flush(self) -> None:
        """Run everything queued now (a drain already scheduled then finds nothing to do)."""
        queue = self._queue
        while queue:
            queue.popleft()()


@dataclass(frozen=True, slots=True)
class Upstream:
    """One route and the connection pool of its upstream."""

    route: Route
    pool: UpstreamPool


class _Discard(asyncio.Transport):
    """Where a mirror copy's answer is "written": nowhere. The relay times and parses it as it
    would a client's, so both records of a pair are measured the same way."""

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def writelines(self, list_of_data: object) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def _never_paused() -> None:
    return None


class _Relay:
    """The per-request sink: write one upstream read to the client, then time and parse it.

    Runs inside the upstream protocol's `data_received`, so nothing is queued between the two
    sockets. Returns True when the client's send buffer is over the high-water mark.

    `start` sends the response head with the body bytes read with the upstream's head, in one
    send (one wake-up of the client instead of two), or alone at once when none came with it.
    The final chunk is not joined to the read that ends the body: the client then had its end
    before the proxy's bookkeeping of the request, and a burst of 32 streams sent its next burst
    into that bookkeeping (added TTFT p50 +1.4 ms in `tests/bench/load.py` batches).
    """

    __slots__ = (
        "cap", "chunked", "clock", "copy", "decoder", "failure", "lost", "phase", "reader", "relayed", "t_written",
        "tcp_first", "tcp_probe", "transport", "writer",
    )  # fmt: skip

    def __init__(
        self,
        transport: asyncio.Transport | None,
        chunked: bool,
        clock: Clock,
        phase: PhaseClock,
        decoder: SSEDecoder | None,
        reader: StreamReader | None,
        copy: bytearray | None,
        cap: int,
        tcp_probe: Callable[[], TcpInfo | None] | None = None,
    ) -> None:
        self.transport = transport
        self.chunked = chunked
        self.clock = clock
        self.phase = phase
        self.decoder = decoder
        self.reader = reader
        self.copy = copy
        self.cap = cap
        self.t_written: float | None = None  # when the last read was written to the client
        self.lost = False  # a read came after the client left, unwritten
        self.failure: Exception | None = None  # our own code failed on a read (a bug, not the client)
        self.relayed = phase.relay
        self.tcp_probe = tcp_probe  # reads TCP_INFO once, at the first token
        self.tcp_first: TcpInfo | None = None
        self.writer: AbstractStreamWriter | None = None  # aiohttp's writer of the response, after `start`

    @property
    def stream_error(self) -> bool:
        """The stream itself reported an error (a chat `{"error": ...}` chunk, an `event: error`,
        `response.failed`): a client leaving after it is not an abort."""
        reader = self.reader
        return reader is not None and bool(reader.error_type)

    @property
    def done(self) -> bool:
        """The stream's terminal event was written to the client: it has the whole answer."""
        reader = self.reader
        return reader is not None and reader.done

    @property
    def unfinished(self) -> bool:
        """A parsed stream without its dialect's defined end so far (`StreamReader.complete`)."""
        reader = self.reader
        return reader is not None and not reader.complete

    async def start(self, writer: AbstractStreamWriter, first: bytes, whole: bool) -> None:
        """Send the response head, which aiohttp holds (`RelayedResponse`): with `first`, the
        body bytes read with the upstream's head, in one write (with the body's end too when
        `whole`), or alone, at once, when none came with it."""
        self.writer = writer
        t = self.clock()
        transport = self.transport
        if transport is None or transport.is_closing():
            self.lost = True
            raise _ClientGone
        if not first:
            writer.send_headers()
            return
        if whole:
            await writer.write_eof(first)
        else:
            await writer.write(first)
        try:
            self._written(chunk=first, t=t, transport=transport)
        except Exception as exc:  # noqa: BLE001 - our own code failed: logged, and the request is internal_error
            self._failed(exc)

    def __call__(self, chunk: bytes) -> bool:
        try:
            t = self.clock()
            transport = self.transport
            if transport is None or transport.is_closing():
                if self.done:
                    return False  # gone after the end: what follows is dropped until discard_rest takes over
                self.lost = True
                raise _ClientGone
            if not self.chunked:
                transport.write(chunk)
            elif len(chunk) < 16384:
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))  # one small copy, one send
            else:
                transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
            return self._written(chunk, t, transport)
        except _ClientGone:
            raise
        except Exception as exc:  # noqa: BLE001 - our own code failed: logged, and the request is internal_error
            self._failed(exc)
            return False

    def _written(self, chunk: bytes, t: float, transport: asyncio.Transport) -> bool:
        """`chunk` went to the client at `t`: time and parse it; True when the client's buffer is full."""
        self.t_written = t
        self.relayed.append(self.clock() - t)  # the proxy's relay cost for this read
        phase = self.phase
        if phase.t_first_byte is None:
            phase.body_bytes(t)
        reader = self.reader
        if reader is not None:
            try:
                for event in self.decoder.feed(chunk):  # type: ignore[union-attr]
                    if is_chunk(event):
                        phase.chunk(t)
                    if reader.feed(event):
                        phase.token(t)
            except Exception:  # parsing is best effort, forwarding is not
                log.debug("stream parse failed; timing for this request is partial", exc_info=True)
                self.reader = None
            if self.tcp_probe is not None and phase.t_first is not None:
                self.tcp_first = self.tcp_probe()  # once per request, after the bytes went out
                self.tcp_probe = None
        elif self.copy is not None and len(self.copy) < self.cap:
            self.copy += chunk
        return transport.get_write_buffer_size() > HIGH_WATER

    def _failed(self, exc: Exception) -> None:
        """Our own code failed on a read (a bug, never the client's doing): log it, and cut the
        client's connection as when it leaves; the next read then stops the upstream's."""
        log.error("internal error while relaying a response; its connection is closed:\n%s", stack_of(exc))
        self.failure = exc
        transport, self.transport = self.transport, None
        if transport is not None:
            try:
                transport.close()  # what was written is flushed, then FIN: no terminating chunk
            except Exception:  # noqa: BLE001 - a transport that cannot close (a mirror's) is dropped anyway
                pass


class _Exchange:
    """One request through the proxy, as its handler learns about it; `_finish` records it."""

    __slots__ = (
        "client_headers", "dialect", "end", "head_sent", "info", "method", "mirror", "pair_id", "path", "phase", "refused",
        "relay", "route", "span", "status", "tcp_end", "upstream",
    )  # fmt: skip

    def __init__(
        self,
        method: str,
        path: str,
        info: RequestInfo,
        phase: PhaseClock,
        span: RootSpan,
        client_headers: Mapping[str, str],
        route: Route,
        dialect: Dialect | None = None,
    ) -> None:
        self.route = route
        self.dialect = dialect  # None: `other`, forwarded and counted, not parsed
        self.pair_id: str | None = None  # --mirror: shared by the request and its copy
        self.mirror = False  # this is the copy
        self.method = method
        self.path = path
        self.info = info
        self.phase = phase
        self.span = span
        self.client_headers = client_headers
        self.status = 502  # what the client got; 502 until the upstream answered
        self.refused: ErrorType | None = None  # the proxy answered itself (`status`), with this word
        self.end: End = "complete"  # how it ended (see proxy/exchange/outcome.py)
        self.head_sent = False  # the response head went to the client
        self.upstream: UpstreamResponse | None = None
        self.relay: _Relay | None = None
        self.tcp_end: TcpInfo | None = None  # the upstream connection's TCP_INFO as the request ended

    def in_flight(self, now: float, wall: float, gaps: bool) -> InFlight:
        """What is known so far, read from the phase clock and the relay (the live view, on poll)."""
        phase, relay, upstream, info = self.phase, self.relay, self.upstream, self.info
        t0 = phase.t0
        streaming = info.stream or (relay is not None and relay.decoder is not None)
        if phase.tokens:
            reached = "decode"
        elif phase.t_headers is None:
            reached = "network" if phase.t_sent is None else "headers"
        else:
            reached = "prefill_wait" if streaming else "response"
        trace_id = Telemetry.trace_id(self.span)
        written = relay.t_written if relay is not None else None
        return InFlight(
            id=trace_id or f"live-{id(self):x}",
            trace_id=trace_id,
            api=info.api,
            operation=info.operation,
            model=info.model,
            method=self.method,
            stream=streaming,
            upstream=self.route.name,
            started=wall - (now - t0),
            elapsed=now - t0,
            phase=reached,
            status=upstream.status if upstream is not None else None,
            network=None if phase.t_sent is None else phase.t_sent - t0,
            time_to_headers=None if phase.t_headers is None else phase.t_headers - t0,
            ttfb=None if phase.t_first_byte is None else phase.t_first_byte - t0,
            ttft=None if phase.t_first is None else phase.t_first - t0,
            last_token=None if phase.t_last is None else phase.t_last - t0,
            last_byte=None if written is None else written - t0,
            output_tokens=phase.tokens,
            gaps=phase.gaps() if gaps else (),
        )

    def facts(self) -> Facts:
        """What this exchange saw, for `decide`. Before `release_upstream`: a pooled connection
        no longer knows that it was read to its end."""
        relay, upstream, status = self.relay, self.upstream, self.status
        if relay is None:
            return Facts(status=status, refused=self.refused, end=self.end)
        copy = relay.copy
        return Facts(
            status=status,
            refused=self.refused,
            end="internal" if relay.failure is not None else self.end,  # then the client's leaving is our doing
            whole=relay.done or (upstream is not None and upstream.complete and not relay.lost),
            stream_error=relay.stream_error,
            unfinished=relay.unfinished,
            error_head=bytes(copy[:4096]) if copy is not None and status >= 400 else b"",
        )

    def release_upstream(self) -> None:
        """The connection back to the pool after a full read; the rest read in the background when
        the client already has the whole answer; dropped otherwise."""
        upstream, relay = self.upstream, self.relay
        if upstream is None:
            return
        self.tcp_end = upstream.end_tcp()  # before the connection is pooled or discarded
        if relay is not None and relay.done and not upstream.complete:
            upstream.discard_rest()  # keep the connection if the rest comes soon
        else:
            upstream.close()

    def tcp(self) -> TcpStats | None:
        """The upstream connection's TCP_INFO over this request (after `release_upstream`)."""
        if self.upstream is None:
            return None
        first = self.relay.tcp_first if self.relay is not None else None
        return request_stats(self.upstream.tcp_start, first, self.tcp_end)


def server_timing(phase: PhaseClock) -> str:
    """The `Server-Timing` value (W3C; durations in ms) of what is known when the head is sent."""
    sent, headers = phase.t_sent, phase.t_headers
    if sent is None or headers is None:
        return ""
    proxy = phase.t_sent_overhead()
    return f"network;dur={(sent - phase.t0) * 1e3:.3f}, proxy;dur={proxy * 1e3:.3f}, upstream;dur={(headers - sent) * 1e3:.3f}"


def _cut_client(request: web.BaseRequest) -> None:
    """End the client's connection without the final chunk: a cut stream must look cut."""
    transport = request.transport
    if transport is not None:
        transport.close()  # flushes what was written, then FIN; write_eof then fails quietly


def _ended_by(relay: _Relay, exc: Exception) -> End:
    """How a relay that raised `exc` ended. The upstream connection wraps what the relay's sink
    raises; the relay itself knows whether that was the client leaving or our own code failing."""
    if relay.failure is not None:
        return "internal"  # logged by the relay as it failed
    if relay.lost:
        return "client_left"
    if isinstance(exc, BodyFailure):
        return "timeout" if exc.error_type == "timeout" else "stream_cut"
    # Our own code failed outside the sink (the upstream client's): a bug, never the client's doing.
    log.error("internal error while relaying a response; its connection is closed:\n%s", stack_of(exc))
    return "internal"


def _climbs(path: str) -> bool:
    r"""A `.` or `..` segment as some upstream may read it: forwarded after the upstream's base
    path, an upstream that resolves it would serve a path outside that base. Read the widest way:
    percent-decoded until it stops changing (`%2e%2e`, `..%2f`, `%252e`), `\` as `/` (Node's URL,
    IIS), and a segment's `;params` dropped (`..;/`: Tomcat, Jetty, Spring)."""
    for _ in range(3):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    return any(segment.partition(";")[0] in (".", "..") for segment in path.replace("\\", "/").split("/"))


class Forwarder:
    """The aiohttp handler for every path of the proxy port."""

    def __init__(
        self,
        router: Router[Upstream],
        telemetry: Telemetry,
        metrics: Recorder,
        *,
        max_body_bytes: int,
        capture_content: bool = False,
        capture_io_values: bool = False,
        observers: Sequence[Observer | Named[RequestRecord]] = (),
        is_draining: Callable[[], bool] = lambda: False,
        clock: Clock = time.perf_counter,
        server_timing: bool = False,
        attributor: Attributor | None = None,
        prices: PriceTable | None = None,
        wall_clock: Clock = time.time,
        running: InFlightRequests | None = None,
        failures: UpstreamFailures | None = None,
        mirror: tuple[MirrorPolicy, Upstream] | None = None,
        mirror_dropped: Callable[[str], None] = lambda reason: None,
        dialects: Dialects = DIALECTS,
        warnings: RateLimitedLog | None = None,
        forwarded_for: ForwardedFor = "append",
    ) -> None:
        """`mirror`: the policy and the upstream that copies go to (`proxy/exchange/mirror.py`);
        `mirror_dropped(reason)` counts a copy refused by a cap; `forwarded_for`: what a request
        sent upstream carries of the client's address (`proxy/exchange/headers.py`). `capture_io_values`
        (with `capture_content`): the last user message's and the answer's plain text, for the span."""
        self.router = router
        self.dialects = dialects
        self.telemetry = telemetry
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.capture_content = capture_content
        self.capture_io_values = capture_io_values and capture_content
        # Each finished record goes to the metrics (a worker: its shipper), the span, then the
        # observers, each in its own guard; `warnings` logs a failing sink (rate-limited).
        self.sinks: Sinks[RequestRecord] = Sinks(
            [
                Named(metrics.sink_name, metrics.record),
                *(o if isinstance(o, Named) else Named("observer", o) for o in observers),
            ],
            metrics.sink_errors,
            warnings if warnings is not None else RateLimitedLog(log),
            more=("spans", "record"),
        )
        self.is_draining = is_draining
        self.clock = clock
        self.server_timing = server_timing
        self.forwarded_for = forwarded_for
        self.attributor = attributor
        self.prices = prices
        self.wall_clock = wall_clock  # epoch seconds: rate-limit resets given as dates
        self.body_user = attributor is not None and attributor.body_user
        self.running = running  # the live view reads what runs from here, when it polls
        self.failures = failures  # the upstreams' failures, as rate-limited warnings
        self.mirror = mirror
        self.mirror_dropped = mirror_dropped
        self.mirrors: set[asyncio.Task[None]] = set()  # copies running; cancelled at shutdown
        self.finishing = Finishing()  # finished requests whose bookkeeping is still to do
        self.active = 0  # requests (and mirror copies) between their start and their bookkeeping

    def _target(self, request: web.BaseRequest) -> str:
        """Path and query as the client wrote them. Never anything that could change the host."""
        raw = request.raw_path
        if raw[:1] != "/":
            # Absolute-form target (`GET http://other/x`): keep only its path and query. Since the
            # result always follows the upstream's authority, nothing can change the host.
            raw = request.rel_url.raw_path_qs
            if raw[:1] != "/":
                raise BadTarget("the request target must be a path starting with '/'")
        path = raw.partition("?")[0]
        if ("." in path or "%" in path) and _climbs(path):
            raise BadTarget("the request path must not contain '.' or '..' segments")
        return raw

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        t0 = self.clock()
        upstream_name = ""
        try:
            target = self._target(request)
            up, target = self.router.match(target)
            upstream_name = up.route.name
            body = await self._read_body(request)
        except ProxyError as exc:
            path = request.rel_url.raw_path
            self._record_early(self.dialects.api_for_path(path), request.method, path, exc, t0, upstream_name)
            return exc.response()
        path, _, query = target.partition("?")  # the path as the upstream sees it, the prefix stripped
        dialect = self.dialects.for_path(path)  # once per request: its reader then runs per event
        if dialect is None:
            info = request_info(None, body)
        else:
            try:
                info = dialect.inspect(
                    body,
                    capture_content=self.capture_content,
                    end_user=self.body_user,
                    io_values=self.capture_io_values,
                )
            except Exception as exc:  # noqa: BLE001 - a dialect's bug (a plug-in's): the request goes unread
                self.sinks.failed("record", exc)
                info = dialect.unread()
        gauge = self.metrics.in_flight.labels(upstream_name, info.api)
        gauge.inc()
        self.active += 1
        try:
            span = self.telemetry.start(info, request.method, path, query, request.headers, t0, up.route)
        except Exception:  # telemetry must never break a request
            log.exception("could not start the request span")
            span = NOT_TRACED
        x = _Exchange(request.method, path, info, PhaseClock(t0), span, request.headers, up.route, dialect)
        if self.mirror is not None:
            self._offer_mirror(x, request, target, body)
        running = self.running
        if running is not None:
            running.add(x)
        try:
            return await self._forward(request, x, up.pool, target, body)
        except asyncio.CancelledError:  # the client left, or the drain deadline passed
            x.end = "drained" if self.is_draining() else "client_left"
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
            try:
                facts: Facts | None = x.facts()
            except Exception as exc:  # noqa: BLE001 - a bug of ours: the bookkeeping below must still run
                self.sinks.failed("record", exc)  # counted and logged; the request goes unrecorded
                facts = None
            x.release_upstream()
            gauge.dec()
            self.active -= 1
            if running is not None:
                running.discard(x)
            if facts is not None:
                self._finish_later(x, facts)

    async def _forward(
        self, request: web.BaseRequest, x: _Exchange, pool: UpstreamPool, target: str, body: bytes
    ) -> web.StreamResponse:
        """Send the request upstream and relay its answer; what happens is noted on `x`."""
        headers = request_headers(request.headers.items(), request.remote, self.forwarded_for)
        self.telemetry.inject(x.span, headers)
        try:
            upstream = await pool.request(x.method, x.route.base_path + target, headers.items(), body, x.phase)
        except ProxyError as error:  # our own 502/504, never bytes from the wire
            x.status, x.refused = error.status, error.error_type
            log.debug("upstream request failed: %s", error.message)
            if self.failures is not None and not self.is_draining():  # draining: our own doing
                self.failures.before_head(x.route, error)
            return error.response()
        x.upstream = upstream
        x.phase.headers(self.clock())
        x.status = upstream.status
        head = response_headers(upstream.headers)
        if self.server_timing:
            head.add("Server-Timing", server_timing(x.phase))  # beside the upstream's own, if any
        response = RelayedResponse(status=x.status, reason=upstream.reason, headers=head)
        writer = await response.prepare(request)  # the head waits in the writer: `_Relay.start` sends it
        assert writer is not None
        x.head_sent = True
        decoder, reader, copy = self._parsers(x.dialect, upstream, x.status)
        x.relay = _Relay(
            request.transport,
            response.headers.get("Transfer-Encoding", "").lower() == "chunked",  # aiohttp's choice
            self.clock,
            x.phase,
            decoder,
            reader,
            copy,
            MAX_BODY_COPY if x.status < 400 else MAX_ERROR_COPY,
            upstream.tcp_info,
        )
        x.end = await self._relay(upstream, request, response, writer, x.relay, x.route)
        return response

    def _offer_mirror(self, x: _Exchange, request: web.BaseRequest, target: str, body: bytes) -> None:
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
            task = asyncio.ensure_future(self._mirror(to, x, target, body, headers))
        except Exception:  # a copy must never break the request
            log.exception("could not start a mirror copy")
            return
        self.mirrors.add(task)
        task.add_done_callback(self._mirror_done)

    def _mirror_done(self, task: asyncio.Task[None]) -> None:
        self.mirrors.discard(task)
        assert self.mirror is not None
        self.mirror[0].done()
        if not task.cancelled() and task.exception() is not None:
            log.debug("a mirror copy failed", exc_info=task.exception())

    async def _mirror(
        self, to: Upstream, primary: _Exchange, target: str, body: bytes, headers: CIMultiDict[str]
    ) -> None:
        """The copy: the same body to the mirror upstream, its answer read to the end and dropped,
        recorded with the request's pair id; its span links to the request's."""
        t0 = self.clock()
        info, path = primary.info, primary.path
        query = target.partition("?")[2]
        try:
            link = primary.span.get_span_context()
            span = self.telemetry.start(info, primary.method, path, query, {}, t0, to.route, links=(link,))
        except Exception:  # telemetry must never break a request
            log.exception("could not start the mirror's span")
            span = NOT_TRACED
        x = _Exchange(primary.method, path, info, PhaseClock(t0), span, {}, to.route, primary.dialect)
        x.pair_id, x.mirror = primary.pair_id, True
        self.active += 1
        try:
            self.telemetry.inject(span, headers)
            upstream = await to.pool.request(x.method, to.route.base_path + target, headers.items(), body, x.phase)
            x.upstream = upstream
            x.phase.headers(self.clock())
            x.status = upstream.status
            decoder, reader, copy = self._parsers(x.dialect, upstream, x.status)
            cap = MAX_BODY_COPY if x.status < 400 else MAX_ERROR_COPY
            x.relay = _Relay(_Discard(), False, self.clock, x.phase, decoder, reader, copy, cap, upstream.tcp_info)
            await upstream.relay(x.relay, _never_paused)
        except ProxyError as error:
            x.status, x.refused = error.status, error.error_type
        except asyncio.CancelledError:
            x.end = "drained"
            raise
        except Exception as exc:  # noqa: BLE001 - noted as how it ended (and logged when it is ours)
            x.end = _ended_by(x.relay, exc) if x.relay is not None else "internal"
            if x.relay is None:
                log.error("internal error in a mirror copy:\n%s", stack_of(exc))
        finally:
            facts = x.facts()
            x.release_upstream()
            self.active -= 1
            self._finish_later(x, facts)

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        limit = self.max_body_bytes
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

    def _parsers(
        self, dialect: Dialect | None, resp: UpstreamResponse, status: int
    ) -> tuple[SSEDecoder | None, StreamReader | None, bytearray | None]:
        """What to run on the copy: an SSE decoder + dialect reader, or a bounded body copy."""
        encoding = resp.content_encoding
        if encoding is not None and encoding.lower() != "identity":
            return None, None, None  # compressed: forwarded untouched, not parsed
        ctype = (resp.content_type or "").lower()
        if ctype.startswith("text/event-stream") and dialect is not None:
            return SSEDecoder(), dialect.stream_reader(self.capture_content), None
        if status >= 400 or (dialect is not None and "json" in ctype):
            return None, None, bytearray()
        return None, None, None

    async def _relay(
        self,
        upstream: UpstreamResponse,
        request: web.BaseRequest,
        response: web.StreamResponse,
        writer: AbstractStreamWriter,
        relay: _Relay,
        route: Route,
    ) -> End:
        """Send the head, relay the body to its end; returns how it ended."""
        transport = request.transport

        async def drained() -> None:
            # aiohttp has no public "wait until the client drained" for raw writes; a slow
            # client is the rare case, so a short poll costs nothing on the hot path.
            while (
                transport is not None and not transport.is_closing() and transport.get_write_buffer_size() > LOW_WATER
            ):
                await asyncio.sleep(DRAIN_POLL)

        try:
            await relay.start(writer, upstream.take_read(), upstream.complete)
            await upstream.relay(relay, drained)
        except Exception as exc:  # noqa: BLE001 - noted as how it ended (and logged when it is ours)
            end = _ended_by(relay, exc)
            if end == "client_left" or end == "internal":
                if transport is not None:
                    transport.close()  # what was written is flushed, then FIN
            else:
                _cut_client(request)  # transparent: the client sees the cut it would have seen upstream
                if not relay.done and self.failures is not None and isinstance(exc, BodyFailure):
                    self.failures.in_body(route, exc)
            return end
        if relay.failure is not None:
            return "internal"  # on the last read: the client's connection is already cut
        try:  # at once: the end of a response never waits for anyone's bookkeeping
            await response.write_eof()
        except ConnectionError:  # the client left after the whole body: nothing was lost
            return "client_left"
        return "complete"

    def _finish_later(self, x: _Exchange, facts: Facts) -> None:
        """The request's bookkeeping, its end stamped now: queued (see `Finishing`) while other
        requests are in flight or others are queued; done at once otherwise (no other
        connection's bytes can be waiting behind it, and the record is there when the client
        has its answer)."""
        t_end = self.clock()
        if self.active or self.finishing:
            self.finishing.add(lambda: self._finish(x, facts, t_end))
        else:
            self._finish(x, facts, t_end)

    def flush(self) -> None:
        """Record every finished request still queued (at exit, before the sinks flush)."""
        self.finishing.flush()

    def _finish(self, x: _Exchange, facts: Facts, t_end: float) -> None:
        """The request's outcome, decided once from what `x` saw; its record, to every sink.
        `t_end`: when the handler was done with it (the end of a request not timed to its last byte)."""
        try:
            outcome = decide(facts)
            record, text, value = self._record(x, outcome, t_end)
        except Exception as exc:  # noqa: BLE001 - counted and logged: telemetry never breaks a request
            self.sinks.failed("record", exc)
            return
        try:
            self.telemetry.finish(x.span, record, text, output_value=value)
        except Exception as exc:  # noqa: BLE001 - counted and logged; the other sinks still run
            self.sinks.failed("spans", exc)
        self.sinks(record)

    def _record(self, x: _Exchange, outcome: Outcome, t_done: float) -> tuple[RequestRecord, str | None, str | None]:
        """The record of a finished exchange, and for its span the output messages and the
        answer's plain text (each None unless captured)."""
        info, phase, relay = x.info, x.phase, x.relay
        reader = relay.reader if relay is not None else None  # None if parsing gave up midway
        copy = relay.copy if relay is not None else None
        last_byte = relay.t_written if relay is not None else None
        t_end = last_byte if outcome.at_last_byte and last_byte is not None else t_done
        if copy is not None and not outcome.error_type and len(copy) < MAX_BODY_COPY and x.dialect is not None:
            reader = x.dialect.read_body(bytes(copy), self.capture_content)  # a whole (< 400) body
        streaming = info.stream or phase.tokens > 0
        usage, source = usage_of(reader, streaming, phase.tokens)
        timing = phase.finish(t_end, usage.output_tokens, streaming=streaming, last_byte=last_byte)
        response_model = reader.response_model if reader is not None else None
        text = reader.output_messages if reader is not None else None
        value = reader.output_value if reader is not None and self.capture_io_values else None
        try:
            traced = self.telemetry.conclude(x.span, outcome.error_type, timing, text, value)
        except Exception as exc:  # noqa: BLE001 - counted and logged; the record still goes to the other sinks
            self.sinks.failed("spans", exc)
            traced = _UNTRACED
        record = RequestRecord(
            trace_id=traced.trace_id,
            upstream=x.route.name,
            pair_id=x.pair_id,
            mirror=x.mirror,
            api=info.api,
            operation=info.operation,
            model=info.model,
            response_model=response_model,
            stream=streaming,
            method=x.method,
            path=x.path,
            status_code=outcome.status,
            error_type=outcome.error_type,
            timing=timing,
            usage=usage,
            usage_source=source,
            finish_reasons=tuple(reader.finish_reasons) if reader is not None else (),
            response_id=reader.response_id if reader is not None else None,
            provider=info.provider,
            sampling=traced.sampling,
            attributes=self.attributor(x.client_headers, info.end_user) if self.attributor is not None else (),
            rate_limits=read_rate_limits(
                x.upstream.headers if x.upstream is not None else (), self._wall_time_of(phase.t_headers)
            ),
            cost=self._cost(info.model, response_model, usage, source),
            tcp=x.tcp(),
            span=traced.span,
            input_content=info.content
            if info.content is not None and len(info.content) <= RING_CONTENT_LIMIT
            else None,
        )
        return record, text, value

    def _wall_time_of(self, t: float | None) -> float:
        """Epoch seconds of monotonic time `t` (now when None): rate-limit resets count from the headers."""
        now = self.clock()
        return self.wall_clock() - (now - (t if t is not None else now))

    def _cost(self, model: str | None, response_model: str | None, usage: Usage, source: str) -> Cost | None:
        """Priced when the upstream reported the input: with its output, or with the output counted
        when the stream ended before its final usage (Anthropic reports the input first; the
        upstream bills at least what it streamed). A count alone lacks the input: a guess, never priced."""
        if self.prices is None or (source != "reported" and usage.input_tokens is None):
            return None
        return cost_of(self.prices, usage, model, response_model)

    def _record_early(self, api: str, method: str, path: str, exc: ProxyError, t0: float, upstream: str) -> None:
        """A request refused before forwarding still counts (and is timed) in the metrics."""
        timing = PhaseClock(t0).finish(self.clock(), streaming=False)
        record = RequestRecord(
            trace_id=None,
            upstream=upstream,
            api=api,
            operation=None,
            model=None,
            response_model=None,
            stream=False,
            method=method,
            path=path,
            status_code=exc.status,
            error_type=exc.error_type,
            timing=timing,
            usage=Usage(),
            usage_source="none",
            finish_reasons=(),
            response_id=None,
        )
        self.sinks(record)
