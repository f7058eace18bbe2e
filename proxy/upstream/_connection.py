"""The asyncio side of one upstream connection: feeds a `ResponseCycle` and does what its events say.

It owns what is I/O: the transport (write, pause, abort), the idle read timer, the futures the
pool and the relay wait on, the body read before the relay attached, and `TCP_INFO`. Whether the
connection may go on, and why a response failed, is the cycle's to say.

Each read is parsed and its body handed to the sink inside `data_received`, on the same call: the
relay writes it to the client before the event loop does anything else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import proxy.upstream.tcpinfo as tcpinfo
from proxy.errors import BodyFailure
from proxy.upstream._cycle import BODY_ENDED, CLOSED, DONE, FAIL, HEAD_READY, IDLE, MUST_CLOSE, ResponseCycle
from proxy.upstream.tcpinfo import TcpInfo

__all__ = ["PENDING_LIMIT", "Connection", "Sink"]

Sink = Callable[[bytes], bool]  # returns True when the client's buffer is full: pause reading

PENDING_LIMIT = 256 * 1024  # body read before the relay attaches; more waits in the socket


class Connection(asyncio.Protocol):
    """One upstream connection, at most one request at a time. `on_gone(self)` runs when it closes."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, cycle: ResponseCycle, on_gone: Callable[[Connection], None]
    ) -> None:
        self.loop = loop
        self.cycle = cycle
        self.on_gone = on_gone
        self.transport: asyncio.Transport | None = None
        self.sock: Any = None  # the TCP socket (under TLS too), for TCP_INFO
        self.tcp_last: TcpInfo | None = tcpinfo.NEW_CONNECTION  # the latest TCP_INFO reading
        self.closed = False  # the transport is closed or closing
        self.idle_timer: asyncio.TimerHandle | None = None  # while pooled: closes it after the keep-alive
        self.timer: asyncio.TimerHandle | None = None  # the idle read timeout, while bytes are due
        self.read_timeout = 0.0
        self.last_read = 0.0
        self.paused = False
        self.head_waiter: asyncio.Future[None] | None = None
        self.body_waiter: asyncio.Future[None] | None = None
        self.pending: list[bytes] = []  # body read before the relay was attached
        self.pending_bytes = 0
        self.sink: Sink | None = None

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        cycle = self.cycle
        chunk = cycle.receive(data)
        if chunk is not None:
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
                    cycle.sink_failed()
        if cycle.fault is not None:
            cycle.settle()  # what was parsed before the error was good body, relayed above
        if cycle.events:
            self._react()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: BaseException | None) -> None:
        cycle = self.cycle
        if cycle.busy and not self.closed:
            self.read_tcp()  # the transport closes the socket only after this returns
        self.closed = True
        self.on_gone(self)
        self._cancel_timer()
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        cycle.closed()
        if cycle.events:
            self._react()

    def pause_writing(self) -> None:  # the request body is in memory already; nothing to pause
        pass

    def resume_writing(self) -> None:
        pass

    # --- the cycle's events ----------------------------------------------------------------

    def _react(self) -> None:
        cycle = self.cycle
        events = cycle.events
        while events:
            event = events.pop(0)
            if event is HEAD_READY:
                waiter = self.head_waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            elif event is BODY_ENDED:
                self._cancel_timer()
                waiter = self.body_waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            else:  # FAIL or CLOSE: the connection goes
                if not self.closed:
                    self.read_tcp()  # the request's end reading, before the socket goes
                self.abort()
                if event is FAIL:
                    failure = cycle.failure
                    assert failure is not None
                    for waiter in (self.head_waiter, self.body_waiter):
                        if waiter is not None and not waiter.done():
                            waiter.set_exception(failure)

    # --- driving one request -----------------------------------------------------------------

    def start(self, head: bytes, body: bytes, *, head_only: bool, reused: bool, read_timeout: float) -> None:
        """Write the request; `head_waiter` resolves when the response head is in."""
        self.cycle.start(head_only=head_only, reused=reused)
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
        if self.paused or not self.cycle.waiting:
            return
        due = self.last_read + self.read_timeout
        if self.loop.time() < due:
            self.timer = self.loop.call_at(due, self._check_idle)
            return
        self.cycle.timed_out(self.read_timeout)
        self._react()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def take_pending(self) -> bytes:
        """The body read before a relay attached (with the head, typically), taken out: the caller
        sends it with the response head in one write."""
        pending, self.pending, self.pending_bytes = self.pending, [], 0
        return pending[0] if len(pending) == 1 else b"".join(pending)

    async def relay(self, sink: Sink, drained: Callable[[], Awaitable[None]]) -> None:
        """Hand every read of the body to `sink` until the end. Raises `BodyFailure`."""
        pending, self.pending, self.pending_bytes = self.pending, [], 0
        for chunk in pending:
            if sink(chunk):
                self.pause()
        self.sink = sink
        cycle = self.cycle
        while True:
            state = cycle.state
            if state is DONE or state is MUST_CLOSE:
                return
            if cycle.failure is not None:
                raise cycle.failure
            if state is CLOSED:
                raise BodyFailure("stream_cut", "the response was closed before its end")
            if self.paused:
                await drained()
                self.resume()
                continue
            self.body_waiter = self.loop.create_future()
            try:
                await self.body_waiter
            finally:
                self.body_waiter = None

    def discard(self, budget: int) -> None:
        """Read the rest of the body without relaying it, at most `budget` bytes more (counting
        what was read before a relay attached)."""
        budget -= self.pending_bytes
        self.pending, self.pending_bytes = [], 0
        self.cycle.discard(budget)
        if self.cycle.events:
            self._react()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
            _resolve(self.body_waiter)

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.last_read = self.loop.time()  # the wait was ours, not the upstream's
            self.transport.resume_reading()
            if self.timer is None and self.cycle.waiting:
                self.timer = self.loop.call_at(self.last_read + self.read_timeout, self._check_idle)

    def release(self) -> bool:
        """The request is over. True: the connection is ready for another (the caller pools it);
        False: it was closed."""
        self._cancel_timer()
        self.sink = None
        if self.cycle.release() and not self.closed:
            if self.paused and self.transport is not None:
                self.paused = False
                self.transport.resume_reading()
            self.head_waiter = self.body_waiter = None
            self.pending, self.pending_bytes = [], 0
            return True
        self.abort()
        return False

    # --- the pool's hold on an idle connection -------------------------------------------------

    def park(self, keepalive: float) -> None:
        """Idle in the pool: closed after `keepalive` seconds unless taken."""
        self.idle_timer = self.loop.call_later(keepalive, self.abort)

    def unpark(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None

    @property
    def usable(self) -> bool:
        """Open, and no request owns it."""
        transport = self.transport
        return (
            not self.closed and transport is not None and not transport.is_closing()
            and self.cycle.state is IDLE
        )  # fmt: skip

    # --- TCP_INFO and closing ----------------------------------------------------------------

    def read_tcp(self) -> TcpInfo | None:
        """`TCP_INFO` now (one system call), kept as the connection's latest reading."""
        self.tcp_last = tcpinfo.read(self.sock)
        return self.tcp_last

    def abort(self) -> None:
        self._cancel_timer()
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()
        self.on_gone(self)


def _resolve(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
