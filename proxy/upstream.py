"""The upstream HTTP/1.1 client: pooled keep-alive connections to one origin, built for relaying.

Why not `aiohttp.ClientSession`: a request through it (with trace signals for the phase timings)
cost ~0.3 ms of CPU before the first byte left, and every body chunk took a trip through a
`StreamReader` and a task wake-up before it could be written on. Here the response is parsed by
llhttp (`httptools`, the parser of Node.js and uvicorn) inside `data_received`, and the body of
each read is handed straight to a sink on the same call: the relay writes it to the client
before the event loop does anything else.

    pool = UpstreamPool(URL("https://taotoken.net/api"), connect_timeout=10, read_timeout=300, keepalive=4)
    resp = await pool.request("POST", "/api/v1/chat/completions", headers, body, phase)
    await resp.relay(sink, drained)     # sink(bytes) per read; True asks to pause reading
    resp.close()                        # or resp.discard_rest() when the client left with all it needed

Timings go straight into the request's `PhaseClock` (pool wait, DNS, connect incl. TLS, reuse,
request written). The connection's `TCP_INFO` is read as a request ends (`end_tcp()`, or, if the
connection fails first, just before its socket closes); one request's end reading is the next
one's baseline (`tcp_start`), so counting per request costs no extra system call. Failures
before the response head raise a `ProxyError` (`UpstreamUnreachable`, `UpstreamTimeout`,
`UpstreamBroken`) with our own message (never bytes from the wire); failures in the body raise
`BodyFailure` with an error type (the tree is drawn in `proxy/errors.py`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import httptools
from yarl import URL

from proxy import tcpinfo
from proxy.envproxy import ForwardProxy
from proxy.errors import BodyFailure, ProxyError, UpstreamBroken, UpstreamTimeout, UpstreamUnreachable
from proxy.tcpinfo import TcpInfo
from proxy.timing import PhaseClock

__all__ = ["UpstreamPool", "UpstreamResponse"]

Clock = Callable[[], float]
Sink = Callable[[bytes], bool]  # returns True when the client's buffer is full: pause reading

HEAD_LIMIT = 64 * 1024  # response status line + headers; more is a broken upstream
FIELD_LIMIT = 16 * 1024  # one header line
PENDING_LIMIT = 256 * 1024  # body read before the relay attaches; more waits in the socket
DNS_TTL = 60.0
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "DELETE", "CONNECT"})


class _Stale(Exception):
    """A reused connection died before any byte of the response: safe to retry idempotent requests."""


class _Connection(asyncio.Protocol):
    """One upstream connection. Parses responses as they arrive; at most one request at a time."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_timer: asyncio.TimerHandle | None = None
        self.sock: Any = None  # the TCP socket (under TLS too), for TCP_INFO
        self.tcp_last: TcpInfo | None = tcpinfo.NEW_CONNECTION  # the latest TCP_INFO reading
        self._reset()

    def _reset(self) -> None:
        self.busy = False
        self.reused = False  # taken from the pool for this request (a stale one may be retried)
        self.head_only = False  # a HEAD request: the response has no body whatever it says
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[str, str]] = []
        self.framed = False  # Content-Length or chunked: EOF before the end is a cut
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.head_bytes = 0
        self.got_bytes = False
        self.failure: BaseException | None = None
        self.head_waiter: asyncio.Future[None] | None = None
        self.body_waiter: asyncio.Future[None] | None = None
        self.pending: list[bytes] = []  # body read before the relay was attached
        self.pending_bytes = 0
        self.sink: Sink | None = None
        self.paused = False
        self.last_read = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.parts: list[bytes] = []

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            self.abort()  # bytes nobody asked for: the connection cannot be trusted any more
            return
        self.got_bytes = True
        self.last_read = self.loop.time()
        if not self.head_done:
            self.head_bytes += len(data)
        error: BaseException | None = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.head_done:
                error = BodyFailure("stream_cut", f"invalid response body framing ({type(exc).__name__})")
            else:
                error = _broken("sent an invalid HTTP response")
        except ProxyError as exc:
            error = exc if not self.head_done else BodyFailure("stream_cut", exc.message)
        if error is None and not self.head_done and self.head_bytes > HEAD_LIMIT:
            error = _broken(f"sent a response head over {HEAD_LIMIT} bytes")
        parts = self.parts
        if parts:  # what was parsed before any error is good body: relay it
            chunk = parts[0] if len(parts) == 1 else b"".join(parts)
            parts.clear()
            sink = self.sink
            if sink is None:
                self.pending.append(chunk)
                self.pending_bytes += len(chunk)
                if self.pending_bytes > PENDING_LIMIT:
                    self.pause()  # the relay is not attached yet: hold the rest in the kernel
            else:
                try:
                    if sink(chunk):
                        self.pause()
                except Exception:  # noqa: BLE001 - the sink handles its own errors; never let one escape into the loop
                    error = BodyFailure("client_abort", "the body could not be relayed to the client")
        if error is not None:
            self._fail(error)
            return
        if self.complete or (self.head_done and self.head_only):
            self._finish_body()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.busy and not self.closed:
            self.read_tcp()  # the transport closes the socket only after this returns
        self.closed = True
        self.pool._forget(self)
        self._cancel_timer()
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        if not self.busy or self.complete:
            return
        if not self.head_done:
            if self.reused and not self.got_bytes:
                self._fail(_Stale())
            else:
                self._fail(_broken("closed the connection before responding"))
        elif not self.framed and not self.head_only:
            self.complete = True  # no length given: the body ends with the connection
            self._finish_body()
        else:
            self._fail(BodyFailure("stream_cut", "upstream closed the connection mid-body"))

    def pause_writing(self) -> None:  # the request body is in memory already; nothing to pause
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools callbacks -----------------------------------------------------------------

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # chunked trailers: not relayed (the client's framing is the proxy's own)
        if len(name) + len(value) > FIELD_LIMIT:
            raise _broken(f"sent a header line over {FIELD_LIMIT} bytes")
        key = name.decode("ascii", "surrogateescape")
        lower = key.lower()
        if lower == "content-length" or (lower == "transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True  # otherwise the body runs to the end of the connection (RFC 9112 §6.3)
        self.headers.append((key, value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        if self.head_done:
            raise _broken("sent a second response to one request")
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                raise _broken("switched protocols, which the proxy does not relay")
            self.reason, self.headers, self.framed = b"", [], False  # interim (e.g. 103): wait on
            return
        self.status = status
        self.head_done = True
        if self.head_waiter is not None and not self.head_waiter.done():
            self.head_waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        if self.head_done and not self.complete:
            self.complete = True
            self.keep_alive = self.parser.should_keep_alive()  # llhttp resets it for the next message

    # --- driving one request -----------------------------------------------------------------

    def start(self, head: bytes, body: bytes, head_only: bool, read_timeout: float) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        self.busy = True
        self.head_only = head_only
        self.read_timeout = read_timeout
        self.head_waiter = self.loop.create_future()
        self.last_read = self.loop.time()
        self.timer = self.loop.call_at(self.last_read + read_timeout, self._check_idle)
        assert self.transport is not None
        if body:
            self.transport.writelines((head, body))
        else:
            self.transport.write(head)

    def _check_idle(self) -> None:
        """One timer per request, re-armed lazily: a read only stores its time (cheap per event)."""
        self.timer = None
        if self.paused or not self.busy or self.complete:
            return
        due = self.last_read + self.read_timeout
        now = self.loop.time()
        if now < due:
            self.timer = self.loop.call_at(due, self._check_idle)
            return
        if not self.head_done:
            self._fail(
                UpstreamTimeout(f"upstream {self.pool.where} sent no response headers within the idle read timeout")
            )
        else:
            self._fail(BodyFailure("timeout", f"upstream sent nothing for {self.read_timeout:g}s mid-body"))

    def _cancel_timer(self) -> bool:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            return True
        return False

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        if not self.closed:
            self.read_tcp()  # the request's end reading, before the socket goes
        self.abort()
        if self.complete:
            return  # the response was whole; only the connection is spoiled
        for waiter in (self.head_waiter, self.body_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)

    def _finish_body(self) -> None:
        self.complete = True
        self._cancel_timer()
        if self.body_waiter is not None and not self.body_waiter.done():
            self.body_waiter.set_result(None)

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
            if self.body_waiter is not None and not self.body_waiter.done():
                self.body_waiter.set_result(None)

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.last_read = self.loop.time()  # the wait was ours, not the upstream's
            self.transport.resume_reading()
            if self.timer is None and not self.complete:
                self.timer = self.loop.call_at(self.last_read + self.read_timeout, self._check_idle)

    def read_tcp(self) -> TcpInfo | None:
        """`TCP_INFO` now (one system call), kept as the connection's latest reading."""
        self.tcp_last = tcpinfo.read(self.sock)
        return self.tcp_last

    def abort(self) -> None:
        self._cancel_timer()
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()
        self.pool._forget(self)

    def release(self) -> None:
        """Back to the pool when the response was read to its end and the upstream allows it."""
        self._cancel_timer()
        keep = (
            self.complete and not self.closed and not self.head_only and self.failure is None
            and self.keep_alive
        )  # fmt: skip
        if keep and self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        if not keep:
            self.abort()
            return
        self._reset()
        self.pool._idle(self)


class UpstreamResponse:
    """The response head, and `relay()` for the body."""

    __slots__ = ("_conn", "_pool", "headers", "reason", "status", "tcp_start")

    def __init__(self, conn: _Connection, pool: UpstreamPool) -> None:
        self._conn = conn
        self._pool = pool
        self.status = conn.status
        self.reason = conn.reason.decode("latin-1", "replace").strip() or None
        self.headers = conn.headers
        # TCP_INFO when the request took the connection: zero counters for a new one, else the
        # reading at the end of its previous request (nothing of ours was in flight since).
        self.tcp_start = conn.tcp_last

    def header(self, name: str, default: str = "") -> str:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return default

    async def relay(self, sink: Sink, drained: Callable[[], Awaitable[None]]) -> None:
        """Hand every read of the body to `sink` until the end. Raises `BodyFailure`.

        `sink` runs inside `data_received`; when it returns True, reading pauses until
        `drained()` returns (the client caught up).
        """
        conn = self._conn
        pending, conn.pending, conn.pending_bytes = conn.pending, [], 0
        for chunk in pending:
            if sink(chunk):
                conn.pause()
        conn.sink = sink
        while True:
            if conn.complete:
                return
            if conn.failure is not None:
                raise conn.failure
            if conn.paused:
                await drained()
                conn.resume()
                continue
            conn.body_waiter = conn.loop.create_future()
            try:
                await conn.body_waiter
            finally:
                conn.body_waiter = None

    @property
    def complete(self) -> bool:
        """The body was read to its end."""
        return self._conn.complete

    def tcp_info(self) -> TcpInfo | None:
        """The connection's `TCP_INFO` now; None off Linux or once it is closed."""
        conn = self._conn
        return None if conn.closed else tcpinfo.read(conn.sock)

    def end_tcp(self) -> TcpInfo | None:
        """`TCP_INFO` as the request ends (before `close()` or `discard_rest()`), or the reading
        taken as the connection closed; it is also the connection's next request's baseline."""
        conn = self._conn
        return conn.tcp_last if conn.closed else conn.read_tcp()

    def close(self) -> None:
        """Reuse the connection if the body was read to its end, else drop it."""
        conn = self._conn
        conn.sink = None
        conn.release()
        self._pool._release_slot()

    def discard_rest(self) -> None:
        """Instead of `close()`, when the client already has all it needs of the body (a stream's
        terminal event) and left: read the rest in the background, discarding it, so the
        connection can go back to the pool; past the pool's bounds it is closed instead."""
        self._pool._discard_rest(self)


async def _nothing_to_drain() -> None:
    return None


class _Discard:
    """The sink of `discard_rest`: counts the bytes it drops; over its budget it raises, and
    `data_received` turns that into a failure that closes the connection."""

    __slots__ = ("left",)

    def __init__(self, budget: int) -> None:
        self.left = budget

    def __call__(self, chunk: bytes) -> bool:
        self.left -= len(chunk)
        if self.left < 0:
            raise OverflowError("more body than the discard budget")
        return False


class _TunnelOpener(asyncio.Protocol):
    """Reads a forward proxy's answer to CONNECT: the status line and headers, nothing more."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.answer: asyncio.Future[tuple[int, str]] = loop.create_future()
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if self.answer.done():
            return
        if end < 0:
            if len(self.buffer) > HEAD_LIMIT:
                self.answer.set_exception(UpstreamUnreachable("the forward proxy sent an oversized answer to CONNECT"))
            return
        line = self.buffer.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            self.answer.set_exception(UpstreamUnreachable("the forward proxy answered CONNECT with something not HTTP"))
            return
        self.answer.set_result((int(parts[1]), parts[2].strip() if len(parts) > 2 else ""))

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(ConnectionResetError("the forward proxy closed the connection during CONNECT"))


def _proxy_auth_wanted(forward: ForwardProxy) -> UpstreamUnreachable:
    have = "were refused" if forward.authorization else "are missing"
    return UpstreamUnreachable(
        f"the {forward.where} wants credentials (407 Proxy Authentication Required) and they {have}: "
        f"set {forward.variable}=http://USER:PASSWORD@{forward.shown.removeprefix('http://')}"
    )


def _broken(what: str) -> UpstreamBroken:
    return UpstreamBroken(what)  # the pool prefixes "upstream host:port" when it raises


class UpstreamPool:
    """Keep-alive connections to one upstream origin (scheme, host, port)."""

    def __init__(
        self,
        base: URL,
        *,
        connect_timeout: float,
        read_timeout: float,
        keepalive: float,
        max_connections: int = 0,
        discard_bytes: int = 64 * 1024,
        discard_seconds: float = 1.0,
        ssl_context: ssl.SSLContext | None = None,
        forward_proxy: ForwardProxy | None = None,
        clock: Clock = time.perf_counter,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.loop = loop or asyncio.get_running_loop()
        self.scheme = base.scheme
        self.host = base.raw_host or ""
        self.port = base.port or (443 if base.scheme == "https" else 80)
        self.where = f"{self.host}:{self.port}"
        self.authority = _authority(self.host, self.port, base.scheme)
        # Through a forward proxy: an https upstream is reached through a CONNECT tunnel (TLS end
        # to end); an http one gets absolute-form requests (`POST http://host/path`), as curl,
        # requests and aiohttp do. Either way the connection is opened to the proxy.
        self.forward = forward_proxy
        self.tunnel = forward_proxy is not None and base.scheme == "https"
        self.target_prefix = f"http://{self.authority}" if forward_proxy is not None and not self.tunnel else ""
        self.proxy_auth = ""
        if forward_proxy is not None and forward_proxy.authorization and not self.tunnel:
            self.proxy_auth = f"Proxy-Authorization: {forward_proxy.authorization}\r\n"
        self.dial_host = forward_proxy.host if forward_proxy is not None else self.host
        self.dial_port = forward_proxy.port if forward_proxy is not None else self.port
        self.dial_where = forward_proxy.where if forward_proxy is not None else f"upstream {self.where}"
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive = keepalive
        self.discard_bytes = discard_bytes  # bounds on reading a body nobody will receive (discard_rest)
        self.discard_seconds = discard_seconds
        self.ssl = (ssl_context or ssl.create_default_context()) if base.scheme == "https" else None
        self.clock = clock
        self._limit = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._free: deque[_Connection] = deque()
        self._all: set[_Connection] = set()
        self._dns: tuple[float, list[tuple[Any, ...]]] | None = None
        self._literal = _is_ip(self.dial_host)
        self._closed = False
        self._discarding: set[asyncio.Task[None]] = set()  # owned here: close() cancels and awaits them

    # --- bookkeeping used by connections ---------------------------------------------------

    def _forget(self, conn: _Connection) -> None:
        self._all.discard(conn)
        try:
            self._free.remove(conn)
        except ValueError:
            pass

    def _idle(self, conn: _Connection) -> None:
        if self._closed:
            conn.abort()
            return
        conn.idle_timer = self.loop.call_later(self.keepalive, conn.abort)
        self._free.append(conn)

    # --- requests ----------------------------------------------------------------------------

    async def request(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes, phase: PhaseClock
    ) -> UpstreamResponse:
        """Send one request; returns when the response head has arrived. Raises `ProxyError`."""
        if self._closed:
            raise UpstreamUnreachable("the proxy is shutting down")
        head = _request_head(method, self.target_prefix + target, self.authority, headers, body, self.proxy_auth)
        if self._limit is not None:  # a slot per request in flight, released by UpstreamResponse.close
            phase.mark(self.clock())
            await self._limit.acquire()
            phase.pool_wait = phase.since_mark(self.clock())
        try:
            for attempt in (0, 1):
                conn = await self._acquire(phase, fresh=attempt > 0)
                conn.start(head, body, method == "HEAD", self.read_timeout)
                phase.sent(self.clock())
                try:
                    assert conn.head_waiter is not None
                    await conn.head_waiter
                except _Stale:
                    if method in IDEMPOTENT and attempt == 0:
                        continue  # the upstream closed a pooled connection as we reused it
                    raise UpstreamBroken(f"upstream {self.where} closed the connection before responding") from None
                except UpstreamBroken as exc:
                    raise UpstreamBroken(f"upstream {self.where} {exc.message}") from None
                except BaseException:
                    conn.abort()  # cancelled (client gone, drain deadline) or timed out
                    raise
                if conn.status == 407 and self.forward is not None:  # only a proxy sends 407 (RFC 9110)
                    conn.abort()
                    raise _proxy_auth_wanted(self.forward)
                return UpstreamResponse(conn, self)
            raise AssertionError("unreachable")
        except BaseException:
            self._release_slot()
            raise

    def _release_slot(self) -> None:
        if self._limit is not None:
            self._limit.release()

    def _discard_rest(self, resp: UpstreamResponse) -> None:
        conn = resp._conn
        if conn.complete or conn.closed or conn.failure is not None or self._closed or self.discard_seconds <= 0:
            resp.close()
            return
        conn.sink = _Discard(self.discard_bytes)  # at once: reads before the task starts are not relayed
        task = self.loop.create_task(self._discard(resp, conn.sink))
        self._discarding.add(task)
        task.add_done_callback(self._discarding.discard)

    async def _discard(self, resp: UpstreamResponse, sink: Sink) -> None:
        """Read the body to its end within the bounds, then pool the connection; else close it."""
        try:
            await asyncio.wait_for(resp.relay(sink, _nothing_to_drain), self.discard_seconds)
        except (BodyFailure, asyncio.TimeoutError):
            pass  # cut, garbage, over the byte bound or too slow: close() drops the connection
        finally:
            resp.close()  # also releases the connection slot, held until now

    async def _acquire(self, phase: PhaseClock, fresh: bool) -> _Connection:
        conn = None if fresh else self._pop_free()
        if conn is not None:
            phase.reused = conn.reused = True
            return conn
        conn = await self._connect(phase)
        phase.reused = False
        return conn

    def _pop_free(self) -> _Connection | None:
        free = self._free
        while free:
            conn = free.pop()  # most recently used first: the least likely to have timed out
            if conn.idle_timer is not None:
                conn.idle_timer.cancel()
                conn.idle_timer = None
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def _connect(self, phase: PhaseClock) -> _Connection:
        clock = self.clock

        async def connect() -> _Connection:
            addrs = await self._resolve(phase)
            phase.mark(clock())
            last: OSError = OSError("no address")
            for family, _type, proto, _name, sockaddr in addrs:
                try:
                    if self.tunnel:
                        conn = await self._tunnel(family, proto, sockaddr)
                    else:
                        _t, conn = await self.loop.create_connection(
                            lambda: _Connection(self),
                            host=sockaddr[0], port=sockaddr[1], family=family, proto=proto,
                            ssl=self.ssl, server_hostname=self.host if self.ssl else None,
                            ssl_handshake_timeout=self.connect_timeout if self.ssl else None,
                        )  # fmt: skip
                except OSError as exc:
                    last = exc  # try the next address, as aiohttp and curl do
                else:
                    phase.connect = phase.since_mark(clock())
                    return conn
            raise last

        try:
            conn = await asyncio.wait_for(connect(), self.connect_timeout)
        except asyncio.TimeoutError:
            via = f" through the {self.forward.where}" if self.forward is not None else ""
            raise UpstreamTimeout(
                f"connecting to upstream {self.where}{via} timed out after {self.connect_timeout:g}s"
            ) from None
        except ssl.SSLError as exc:
            raise UpstreamUnreachable(
                f"TLS handshake with upstream {self.where} failed ({type(exc).__name__})"
            ) from None
        except OSError as exc:
            raise UpstreamUnreachable(f"cannot connect to {self.dial_where} ({type(exc).__name__})") from None
        if self._closed:
            conn.abort()
            raise UpstreamUnreachable("the proxy is shutting down")
        sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # events must not wait for Nagle
            conn.sock = sock
        self._all.add(conn)
        return conn

    async def _resolve(self, phase: PhaseClock) -> list[tuple[Any, ...]]:
        if self._literal:
            family = socket.AF_INET6 if ":" in self.dial_host else socket.AF_INET
            return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (self.dial_host, self.dial_port))]
        now = self.loop.time()
        if self._dns is not None and now - self._dns[0] < DNS_TTL:
            return self._dns[1]
        phase.mark(self.clock())
        try:
            addrs = await self.loop.getaddrinfo(self.dial_host, self.dial_port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            raise UpstreamUnreachable(self._unresolved()) from None
        phase.dns = phase.since_mark(self.clock())
        if not addrs:
            raise UpstreamUnreachable(self._unresolved())
        self._dns = (now, list(addrs))
        return self._dns[1]

    def _unresolved(self) -> str:
        if self.forward is not None:
            return f"cannot resolve the host of the {self.forward.where}"
        return f"cannot resolve upstream host {self.host}"

    async def _tunnel(self, family: int, proto: int, sockaddr: tuple[Any, ...]) -> _Connection:
        """TCP to the forward proxy, `CONNECT host:port`, then TLS with the upstream inside."""
        assert self.forward is not None and self.ssl is not None
        transport, opener = await self.loop.create_connection(
            lambda: _TunnelOpener(self.loop), host=sockaddr[0], port=sockaddr[1], family=family, proto=proto
        )
        try:
            target = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
            auth = f"Proxy-Authorization: {self.forward.authorization}\r\n" if self.forward.authorization else ""
            transport.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode("latin-1"))
            status, reason = await opener.answer
            if status == 407:
                raise _proxy_auth_wanted(self.forward)
            if status // 100 != 2:
                raise UpstreamUnreachable(
                    f"the {self.forward.where} refused to open a tunnel to {self.where}: {status} {reason}".rstrip()
                )
            conn = _Connection(self)
            tls = await self.loop.start_tls(
                transport, conn, self.ssl, server_hostname=self.host, ssl_handshake_timeout=self.connect_timeout
            )
        except BaseException:
            transport.abort()
            raise
        assert tls is not None
        conn.connection_made(tls)  # start_tls hands the protocol its transport by return, not by callback
        return conn

    async def close(self) -> None:
        """Drop every connection, idle or busy (called after the drain)."""
        self._closed = True
        discarding = list(self._discarding)
        for task in discarding:
            task.cancel()
        if discarding:
            await asyncio.gather(*discarding, return_exceptions=True)
        for conn in list(self._all) + list(self._free):
            conn.abort()
        self._free.clear()
        await asyncio.sleep(0)  # let the transports run their connection_lost


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _authority(host: str, port: int, scheme: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    default = 443 if scheme == "https" else 80
    return shown if port == default else f"{shown}:{port}"


def _request_head(
    method: str, target: str, authority: str, headers: Iterable[tuple[str, str]], body: bytes, extra: str = ""
) -> bytes:
    """Request line and headers. `headers` are already filtered (no Host, framing or hop-by-hop);
    `extra`: lines of our own (a forward proxy's `Proxy-Authorization`)."""
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {authority}\r\n{extra}"]
    for key, value in headers:
        lines.append(f"{key}: {value}\r\n")
    if body or method not in _NO_BODY_METHODS:
        lines.append(f"Content-Length: {len(body)}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("utf-8", "surrogateescape")


def header_items(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(name, value) pairs from a multidict or a list."""
    return list(headers.items()) if isinstance(headers, Mapping) else list(headers)
