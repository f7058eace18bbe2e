"""Helpers shared by the adversarial tests: raw HTTP over a socket, metric samples, resources."""

from __future__ import annotations

import asyncio
import gc
import os

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from tests.fakes import Handler

CHAT = "/v1/chat/completions"
BODY = b'{"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'


async def raw_request(url: str, data: bytes, timeout: float = 5.0) -> bytes:
    """Send bytes as they are, return everything read until the server closes (or timeout)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    writer.write(data)
    await writer.drain()
    out = b""
    try:
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    writer.close()
    return out


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value, 0.0 when absent."""
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def live_tasks() -> int:
    gc.collect()
    return len([t for t in asyncio.all_tasks() if not t.done()])


async def read_stream(session: aiohttp.ClientSession, url: str, body: bytes = BODY) -> tuple[int, bytes]:
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.read()


class Upstream:
    """A bare aiohttp upstream on port 0 with a deep accept queue (FakeUpstream keeps the default 128)."""

    def __init__(self, handler: Handler, *, backlog: int = 2048, **runner_kwargs: object) -> None:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", handler)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, **runner_kwargs)  # type: ignore[arg-type]
        self._backlog = backlog
        self.url = ""

    async def __aenter__(self) -> Upstream:
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0, backlog=self._backlog).start()
        self.url = "http://127.0.0.1:%d" % self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()
