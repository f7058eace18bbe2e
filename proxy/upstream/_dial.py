"""Opening a new upstream connection: DNS (cached for `DNS_TTL`), each address in turn, TLS, a
CONNECT tunnel through a forward proxy, the connect timeout; failures become our own errors."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Callable
from typing import Any

from proxy.config.envproxy import ForwardProxy
from proxy.errors import UpstreamTimeout, UpstreamUnreachable
from proxy.upstream._connection import Connection
from proxy.upstream._steps import Steps
from proxy.upstream._tunnel import open_tunnel

__all__ = ["DNS_TTL", "Dialer"]

DNS_TTL = 60.0

Clock = Callable[[], float]


class Dialer:
    """Opens connections to one upstream origin, directly or through a forward proxy."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        forward: ForwardProxy | None,
        connect_timeout: float,
        clock: Clock,
    ) -> None:
        self.loop = loop
        self.host = host
        self.port = port
        self.where = f"{host}:{port}"
        self.tls = tls
        self.forward = forward
        # Through a forward proxy an https upstream is reached through a CONNECT tunnel (TLS end
        # to end), an http one directly; either way the connection is opened to the proxy.
        self.dial_host = forward.host if forward is not None else host
        self.dial_port = forward.port if forward is not None else port
        self.dial_where = forward.where if forward is not None else f"upstream {self.where}"
        self.connect_timeout = connect_timeout
        self.clock = clock
        self._dns: tuple[float, list[tuple[Any, ...]]] | None = None
        self._literal = _is_ip(self.dial_host)

    async def open(self, phase: Steps, connection: Callable[[], Connection]) -> Connection:
        """A new connection running `connection()`; DNS and connect times go into `phase`.
        Raises `UpstreamUnreachable` or `UpstreamTimeout`."""
        clock = self.clock

        async def connect() -> Connection:
            addrs = await self._resolve(phase)
            phase.mark(clock())
            last: OSError = OSError("no address")
            for family, _type, proto, _name, sockaddr in addrs:
                try:
                    if self.forward is not None and self.tls is not None:
                        conn = await open_tunnel(
                            self.loop, self.forward, sockaddr, family, proto,
                            host=self.host, port=self.port, where=self.where, tls=self.tls,
                            handshake_timeout=self.connect_timeout, connection=connection,
                        )  # fmt: skip
                    else:
                        _t, conn = await self.loop.create_connection(
                            connection,
                            host=sockaddr[0], port=sockaddr[1], family=family, proto=proto,
                            ssl=self.tls, server_hostname=self.host if self.tls else None,
                            ssl_handshake_timeout=self.connect_timeout if self.tls else None,
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
        sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # events must not wait for Nagle
            conn.sock = sock
        return conn

    async def _resolve(self, phase: Steps) -> list[tuple[Any, ...]]:
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


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
