"""The doctor's network step below HTTP: DNS, TCP, TLS, each timed and each failure named with
its fix; through a forward proxy, the proxy's name, TCP to it, `CONNECT host:port` (https) and
TLS with the target inside the tunnel, so a proxy that is down or refuses is told apart from a
target that is unreachable.

    reach(url, route, timeout, tls) -> ["api.example.com resolved (3 ms)", ...]   or raises Unreachable
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time

from yarl import URL

from proxy.tools.client import ms
from proxy.tools.route import ToolRoute, os_reason
from proxy.upstream import tcpinfo

__all__ = ["Unreachable", "reach"]

HEAD_LIMIT = 16 * 1024  # a CONNECT answer's head; more is not a forward proxy talking


class Unreachable(Exception):
    """The target cannot be reached: the cause and the fix."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix


def _ms_since(t: float) -> str:
    return f"{(time.perf_counter() - t) * 1000:.0f} ms"


async def _resolve(host: str, port: int, timeout: float, what: str, fix: str) -> tuple[str, str]:
    """The first address of `host`, and how long resolving it took."""
    t = time.perf_counter()
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout
        )
    except (socket.gaierror, TimeoutError) as exc:
        why = exc.strerror if isinstance(exc, socket.gaierror) else "DNS timed out"
        raise Unreachable(f"cannot resolve {what} ({why})", fix) from None
    return str(infos[0][4][0]), _ms_since(t)


def _round_trip(writer: asyncio.StreamWriter) -> str:
    info = tcpinfo.read(writer.get_extra_info("socket"))
    return f", round trip {ms(info.round_trip)}" if info is not None and info.round_trip is not None else ""


async def _direct(url: URL, route: ToolRoute, timeout: float, tls: ssl.SSLContext) -> list[str]:
    host, port = url.host or "", url.port or (443 if url.scheme == "https" else 80)
    address, took = await _resolve(
        host, port, timeout, repr(host), "check the host name in --base-url, and DNS / network access from this machine"
    )
    notes = [f"{route.described}: {host} resolved ({took})" if route.bypass else f"{host} resolved ({took})"]
    secure = tls if url.scheme == "https" else None
    t = time.perf_counter()
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(address, port, ssl=secure, server_hostname=host if secure else None), timeout
        )
    except ssl.SSLError as exc:
        raise Unreachable(
            f"TLS with {host}:{port} failed ({exc.reason or exc})",
            "is something intercepting TLS (a corporate proxy)? is the port an https port? is the system clock right?",
        ) from None
    except TimeoutError:
        raise Unreachable(
            f"connecting to {host}:{port} timed out after {timeout:.0f}s",
            "a firewall or a required HTTP proxy may be in the way (set HTTPS_PROXY); check the port in --base-url",
        ) from None
    except OSError as exc:
        raise Unreachable(
            f"cannot connect to {host}:{port} ({exc.strerror or exc})",
            "is the server running and the port right? (for the simulator: taotrace sim)",
        ) from None
    connected = _ms_since(t)
    rtt = _round_trip(writer)
    writer.close()
    notes.append(f"connected{' with TLS' if secure else ''} ({connected}{rtt})")
    return notes


async def _through(url: URL, route: ToolRoute, timeout: float, tls: ssl.SSLContext) -> list[str]:
    forward = route.forward
    assert forward is not None
    address, took = await _resolve(
        forward.host, forward.port, timeout, f"the host of the {forward.where}",
        f"check {forward.variable}, and DNS from this machine",
    )  # fmt: skip
    notes = [f"{route.described}: proxy resolved ({took})"]
    t = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(address, forward.port, limit=HEAD_LIMIT), timeout
        )
    except TimeoutError:
        raise Unreachable(*route.unreachable(f"timed out after {timeout:.0f}s")) from None
    except OSError as exc:
        raise Unreachable(*route.unreachable(os_reason(exc))) from None
    try:
        notes.append(f"connected to it ({_ms_since(t)}{_round_trip(writer)})")
        if route.tunnel:
            notes += await _tunnel(url, route, reader, writer, timeout, tls)
    finally:
        writer.close()
    return notes


async def _tunnel(
    url: URL,
    route: ToolRoute,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    timeout: float,
    tls: ssl.SSLContext,
) -> list[str]:
    """CONNECT, then TLS with the target through the tunnel."""
    assert route.forward is not None
    host = url.raw_host or ""
    auth = f"Proxy-Authorization: {route.forward.authorization}\r\n" if route.forward.authorization else ""
    t = time.perf_counter()
    writer.write(f"CONNECT {route.target} HTTP/1.1\r\nHost: {route.target}\r\n{auth}\r\n".encode("latin-1"))
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except TimeoutError:
        raise Unreachable(*route.unreachable(f"no answer to CONNECT within {timeout:.0f}s")) from None
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        raise Unreachable(*route.unreachable("it closed the connection during CONNECT")) from None
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise Unreachable(*route.unreachable("it answered CONNECT with something not HTTP (a SOCKS port?)"))
    status, reason = int(parts[1]), (parts[2].strip() if len(parts) > 2 else "")
    if status // 100 != 2:
        raise Unreachable(*route.refused(status, reason))
    notes = [f"CONNECT {route.target} answered {status} ({_ms_since(t)})"]
    t = time.perf_counter()
    loop = asyncio.get_running_loop()
    try:
        secure = await loop.start_tls(
            writer.transport, writer.transport.get_protocol(), tls, server_hostname=host, ssl_handshake_timeout=timeout
        )
    except (ssl.SSLError, TimeoutError, ConnectionError) as exc:
        why = exc.reason if isinstance(exc, ssl.SSLError) else type(exc).__name__
        raise Unreachable(
            f"TLS with {route.target} through the tunnel failed ({why or exc})",
            "does the forward proxy intercept TLS (it shows its own certificate)? then point SSL_CERT_FILE "
            "at your company's CA bundle; is the port an https port?",
        ) from None
    if secure is not None:
        secure.close()
    notes.append(f"TLS with {host} through the tunnel ({_ms_since(t)})")
    return notes


async def reach(url: URL, route: ToolRoute, timeout: float, tls: ssl.SSLContext) -> list[str]:
    """Open a connection to `url` the way `route` says, step by step; what each step took.
    Raises `Unreachable` at the first step that fails."""
    if route.forward is not None:
        return await _through(url, route, timeout, tls)
    try:
        return await _direct(url, route, timeout, tls)
    except Unreachable as exc:
        if route.bypass is None:
            raise
        fix = exc.fix + (
            "; or take it out of NO_PROXY to go through the forward proxy" if "NO_PROXY" in route.bypass else ""
        )
        raise Unreachable(f"{route.described}: {exc.cause}", fix) from None
