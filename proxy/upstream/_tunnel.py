"""A CONNECT tunnel through a forward proxy, with TLS to the upstream inside it (end to end)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

from proxy.config.envproxy import ForwardProxy
from proxy.errors import UpstreamUnreachable
from proxy.upstream._connection import Connection
from proxy.upstream._cycle import HEAD_LIMIT

__all__ = ["open_tunnel", "proxy_auth_wanted"]


async def open_tunnel(
    loop: asyncio.AbstractEventLoop,
    forward: ForwardProxy,
    sockaddr: tuple[Any, ...],
    family: int,
    proto: int,
    *,
    host: str,
    port: int,
    where: str,
    tls: ssl.SSLContext,
    handshake_timeout: float,
    connection: Callable[[], Connection],
) -> Connection:
    """TCP to the forward proxy at `sockaddr`, `CONNECT host:port`, then TLS with the upstream
    inside; returns `connection()` running over it."""
    transport, opener = await loop.create_connection(
        lambda: _TunnelOpener(loop), host=sockaddr[0], port=sockaddr[1], family=family, proto=proto
    )
    try:
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        auth = f"Proxy-Authorization: {forward.authorization}\r\n" if forward.authorization else ""
        transport.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode("latin-1"))
        status, reason = await opener.answer
        if status == 407:
            raise proxy_auth_wanted(forward)
        if status // 100 != 2:
            raise UpstreamUnreachable(
                f"the {forward.where} refused to open a tunnel to {where}: {status} {reason}".rstrip()
            )
        conn = connection()
        inner = await loop.start_tls(
            transport, conn, tls, server_hostname=host, ssl_handshake_timeout=handshake_timeout
        )
    except BaseException:
        transport.abort()
        raise
    assert inner is not None
    conn.connection_made(inner)  # start_tls hands the protocol its transport by return, not by callback
    return conn


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


def proxy_auth_wanted(forward: ForwardProxy) -> UpstreamUnreachable:
    """The error for a 407 from the forward proxy: which variable to set, never the credentials."""
    have = "were refused" if forward.authorization else "are missing"
    return UpstreamUnreachable(
        f"the {forward.where} wants credentials (407 Proxy Authentication Required) and they {have}: "
        f"set {forward.variable}=http://USER:PASSWORD@{forward.shown.removeprefix('http://')}"
    )
