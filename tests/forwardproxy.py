"""A small forward proxy for the tests, speaking what corporate proxies speak: `CONNECT host:port`
(a tunnel, for https upstreams) and absolute-form requests (`GET http://host/path`, for http
ones), Basic `Proxy-Authorization` (407 without it), a host it refuses (403), and 502 for a
target it cannot reach.

Names in `hosts` resolve to 127.0.0.1 (the tests' upstreams listen there under made-up names,
which the proxy under test never resolves itself: the forward proxy does).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import dataclass, field

from yarl import URL


@dataclass
class Seen:
    """One request the forward proxy received: its request line and Proxy-Authorization."""

    line: str
    authorization: str | None


@dataclass
class ForwardProxyServer:
    hosts: dict[str, str] = field(default_factory=dict)  # made-up name -> address to dial
    credentials: tuple[str, str] | None = None
    refuse: frozenset[str] = frozenset()
    connect_delay: float = 0.0  # before answering CONNECT (shows up in the client's connect time)
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> ForwardProxyServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url(self, user: str | None = None, password: str | None = None) -> str:
        auth = f"{user}:{password}@" if user is not None else ""
        return f"http://{auth}127.0.0.1:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:  # close(): end quietly (asyncio would log a cancelled handler)
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
        authorization = headers.get("proxy-authorization")
        self.seen.append(Seen(line, authorization))
        method, target, _version = line.split(" ", 2)
        if self.credentials is not None:
            wanted = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
            if authorization != wanted:
                writer.write(
                    b'HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm="test"\r\n'
                    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                )
                await writer.drain()
                return
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            rest = b""
        else:
            url = URL(target)
            host, port = url.raw_host or "", str(url.port)
            kept = [h for h in header_lines if h and not h.lower().startswith("proxy-authorization:")]
            rest = "\r\n".join([f"{method} {url.raw_path_qs} HTTP/1.1", *kept, "", ""]).encode("latin-1")
        if host.strip("[]") in self.refuse:
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.hosts.get(host, host), int(port))
        except OSError:  # as squid or tinyproxy: the proxy is up, the target is not reachable from it
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            return
        if method == "CONNECT":
            await asyncio.sleep(self.connect_delay)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            up_writer.write(rest)  # later requests on this connection go through as they are
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
