"""`UpstreamPool`: keep-alive connections to one upstream origin, the connection cap, the retry
of an idempotent request on a stale connection, and reading the rest of a body nobody needs."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterable

from yarl import URL

from proxy.config.envproxy import ForwardProxy
from proxy.errors import BodyFailure, UpstreamBroken, UpstreamUnreachable
from proxy.upstream._connection import Connection
from proxy.upstream._cycle import ResponseCycle, Stale
from proxy.upstream._dial import Dialer
from proxy.upstream._request import IDEMPOTENT, authority, request_head
from proxy.upstream._response import UpstreamResponse
from proxy.upstream._steps import Steps
from proxy.upstream._tunnel import proxy_auth_wanted

__all__ = ["UpstreamPool"]

Clock = Callable[[], float]


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
        self.authority = authority(self.host, self.port, base.scheme)
        # Through a forward proxy: an https upstream is reached through a CONNECT tunnel (TLS end
        # to end); an http one gets absolute-form requests (`POST http://host/path`), as curl,
        # requests and aiohttp do.
        self.forward = forward_proxy
        tunnel = forward_proxy is not None and base.scheme == "https"
        self.target_prefix = f"http://{self.authority}" if forward_proxy is not None and not tunnel else ""
        self.proxy_auth = ""
        if forward_proxy is not None and forward_proxy.authorization and not tunnel:
            self.proxy_auth = f"Proxy-Authorization: {forward_proxy.authorization}\r\n"
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive = keepalive
        self.discard_bytes = discard_bytes  # bounds on reading a body nobody will receive (discard_rest)
        self.discard_seconds = discard_seconds
        self.ssl = (ssl_context or ssl.create_default_context()) if base.scheme == "https" else None
        self.clock = clock
        self._dialer = Dialer(
            self.loop, host=self.host, port=self.port, tls=self.ssl, forward=forward_proxy,
            connect_timeout=connect_timeout, clock=clock,
        )  # fmt: skip
        self._limit = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._free: deque[Connection] = deque()
        self._all: set[Connection] = set()
        self._closed = False
        self._discarding: set[asyncio.Task[None]] = set()  # owned here: close() cancels and awaits them

    # --- requests ----------------------------------------------------------------------------

    async def request(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes, phase: Steps
    ) -> UpstreamResponse:
        """Send one request; returns when the response head has arrived. Raises `ProxyError`."""
        if self._closed:
            raise UpstreamUnreachable("the proxy is shutting down")
        head = request_head(method, self.target_prefix + target, self.authority, headers, body, self.proxy_auth)
        if self._limit is not None:  # a slot per request in flight, released by UpstreamResponse.close
            phase.mark(self.clock())
            await self._limit.acquire()
            phase.pool_wait = phase.since_mark(self.clock())
        try:
            for attempt in (0, 1):
                conn = await self._acquire(phase, fresh=attempt > 0)
                conn.start(
                    head, body, head_only=method == "HEAD", reused=bool(phase.reused), read_timeout=self.read_timeout
                )
                phase.sent(self.clock())
                try:
                    assert conn.head_waiter is not None
                    await conn.head_waiter
                except Stale:
                    if method in IDEMPOTENT and attempt == 0:
                        continue  # the upstream closed a pooled connection as we reused it
                    raise UpstreamBroken(f"upstream {self.where} closed the connection before responding") from None
                except UpstreamBroken as exc:
                    raise UpstreamBroken(f"upstream {self.where} {exc.message}") from None
                except BaseException:
                    conn.abort()  # cancelled (client gone, drain deadline) or timed out
                    raise
                if conn.cycle.status == 407 and self.forward is not None:  # only a proxy sends 407 (RFC 9110)
                    conn.abort()
                    raise proxy_auth_wanted(self.forward)
                return UpstreamResponse(conn, self)
            raise AssertionError("unreachable")
        except BaseException:
            self._release_slot()
            raise

    def _release_slot(self) -> None:
        if self._limit is not None:
            self._limit.release()

    async def _acquire(self, phase: Steps, fresh: bool) -> Connection:
        conn = None if fresh else self._pop_free()
        if conn is not None:
            phase.reused = True
            return conn
        conn = await self._dialer.open(phase, self._new_connection)
        phase.reused = False
        if self._closed:
            conn.abort()
            raise UpstreamUnreachable("the proxy is shutting down")
        self._all.add(conn)
        return conn

    def _new_connection(self) -> Connection:
        return Connection(self.loop, ResponseCycle(self.where), self._forget)

    def _pop_free(self) -> Connection | None:
        free = self._free
        while free:
            conn = free.pop()  # most recently used first: the least likely to have timed out
            conn.unpark()
            if conn.usable:
                return conn
        return None

    def _forget(self, conn: Connection) -> None:
        """A connection closed (its `on_gone`)."""
        self._all.discard(conn)
        try:
            self._free.remove(conn)
        except ValueError:
            pass

    # --- the end of a request (called by UpstreamResponse) -------------------------------------

    def _give_back(self, conn: Connection) -> None:
        """Pool the connection if its response was read to its end and the upstream allows it."""
        if conn.release():
            if self._closed:
                conn.abort()
            else:
                conn.park(self.keepalive)
                self._free.append(conn)
        self._release_slot()

    def _discard_rest(self, resp: UpstreamResponse, conn: Connection) -> None:
        if not conn.cycle.waiting or conn.closed or self._closed or self.discard_seconds <= 0:
            self._give_back(conn)
            return
        conn.discard(self.discard_bytes)  # at once: reads before the task starts are not relayed
        task = self.loop.create_task(self._discard(resp, conn))
        self._discarding.add(task)
        task.add_done_callback(self._discarding.discard)

    async def _discard(self, resp: UpstreamResponse, conn: Connection) -> None:
        """Read the body to its end within the bounds, then pool the connection; else close it."""
        try:
            await asyncio.wait_for(resp.relay(_drop, _nothing_to_drain), self.discard_seconds)
        except (BodyFailure, asyncio.TimeoutError):
            pass  # cut, garbage, over the byte bound or too slow: _give_back drops the connection
        finally:
            self._give_back(conn)  # also releases the connection slot, held until now

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


def _drop(_chunk: bytes) -> bool:
    return False  # never called: a discarding cycle returns no body


async def _nothing_to_drain() -> None:
    return None
