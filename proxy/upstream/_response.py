"""`UpstreamResponse`: one request's handle on its response, from the head to `close()`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import proxy.upstream.tcpinfo as tcpinfo
from proxy.upstream._connection import Connection, Sink
from proxy.upstream.tcpinfo import TcpInfo

if TYPE_CHECKING:
    from proxy.upstream._pool import UpstreamPool

__all__ = ["UpstreamResponse"]


class UpstreamResponse:
    """The response head, and `relay()` for the body."""

    __slots__ = (
        "_conn", "_cycle", "_ended", "_pool", "content_encoding", "content_type", "headers", "reason", "status",
        "tcp_start",
    )  # fmt: skip

    def __init__(self, conn: Connection, pool: UpstreamPool) -> None:
        self._conn = conn
        self._pool = pool
        self._ended = False  # close() or discard_rest() ran: the connection and the slot are no longer ours
        cycle = self._cycle = conn.cycle
        self.status = cycle.status
        self.reason = cycle.reason.decode("latin-1", "replace").strip() or None
        self.headers = cycle.headers
        self.content_type = cycle.content_type  # the first of each, None when not sent
        self.content_encoding = cycle.content_encoding
        # TCP_INFO when the request took the connection: zero counters for a new one, else the
        # reading at the end of its previous request (nothing of ours was in flight since).
        self.tcp_start = conn.tcp_last

    def header(self, name: str, default: str = "") -> str:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return default

    def relay(self, sink: Sink, drained: Callable[[], Awaitable[None]]) -> Coroutine[Any, Any, None]:
        """Hand every read of the body to `sink` until the end (await it). Raises `BodyFailure`.

        `sink` runs inside `data_received`; when it returns True, reading pauses until
        `drained()` returns (the client caught up).
        """
        return self._conn.relay(sink, drained)

    def take_read(self) -> bytes:
        """The body bytes already read (those that came with the head), taken out of the relay's
        way: the caller writes them with the response head in one send, then `relay()` goes on
        from the next read. b"": none yet."""
        return self._conn.take_pending()

    @property
    def complete(self) -> bool:
        """The body was read to its end."""
        return self._cycle.complete

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
        """Reuse the connection if the body was read to its end, else drop it. Only the first call
        (of this or `discard_rest`) counts: by a second one the connection may serve another request."""
        if not self._ended:
            self._ended = True
            self._pool._give_back(self._conn)

    def discard_rest(self) -> None:
        """Instead of `close()`, when the client already has all it needs of the body (a stream's
        terminal event) and left: read the rest in the background, discarding it, so the
        connection can go back to the pool; past the pool's bounds it is closed instead. A no-op
        after `close()` or a first `discard_rest()`."""
        if not self._ended:
            self._ended = True
            self._pool._discard_rest(self, self._conn)
