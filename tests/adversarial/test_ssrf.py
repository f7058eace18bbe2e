"""SSRF: nothing a client sends can make the proxy contact anything but its configured upstream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from tests.adversarial.util import raw_request
from tests.fakes import FakeUpstream


@pytest.fixture
async def bystander() -> AsyncIterator[tuple[str, list[int]]]:
    """Another loopback server the proxy must never connect to; counts connections it gets."""
    hits: list[int] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(1)
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"127.0.0.1:{port}", hits
    server.close()


def _targets(other: str) -> dict[str, bytes]:
    host, port = other.split(":")
    body = f'{{"model": "m", "base_url": "http://{other}", "api_base": "http://{other}", "url": "http://{other}"}}'.encode()
    return {
        "absolute-form": f"GET http://{other}/v1/models HTTP/1.1\r\nHost: {other}\r\n\r\n".encode(),
        "absolute-form-userinfo": f"GET http://user@{other}/v1/models HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "host-header": f"GET /v1/models HTTP/1.1\r\nHost: {other}\r\n\r\n".encode(),
        "x-forwarded-host": f"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Forwarded-Host: {other}\r\nX-Forwarded-Proto: http\r\nX-Original-URL: http://{other}/\r\nForwarded: host={other}\r\n\r\n".encode(),
        "double-slash-authority": f"GET //{other}/v1/models HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "at-sign-path": f"GET @{other}/v1/models HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "slash-at-sign": f"GET /@{other}/v1/models HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "backslash": f"GET /\\\\{other}/v1/models HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "connect-method": f"CONNECT {other} HTTP/1.1\r\nHost: {other}\r\n\r\n".encode(),
        "asterisk": b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
        "encoded-authority": f"GET /%2F%2F{host}%3A{port}/v1/models HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "body-base-url": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body),
    }


@pytest.mark.parametrize(
    "name",
    ["absolute-form", "absolute-form-userinfo", "host-header", "x-forwarded-host", "double-slash-authority",
     "at-sign-path", "slash-at-sign", "backslash", "connect-method", "asterisk", "encoded-authority", "body-base-url"],
)  # fmt: skip
async def test_no_request_can_redirect_the_proxy(proxy, upstream: FakeUpstream, bystander, name: str) -> None:
    other, hits = bystander
    data = _targets(other)[name].replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
    out = await raw_request(proxy.url, data, timeout=3)
    assert out.startswith(b"HTTP/1.")
    assert hits == []  # the other server was never contacted
    status = int(out.split(b" ", 2)[1])
    assert status < 500  # either forwarded to our upstream or refused by us
    if status == 200:
        assert len(upstream.seen) == 1
        # The forwarded Host is always the upstream's own.
        assert upstream.seen[0].headers["Host"] == upstream.url.removeprefix("http://")


async def test_upstream_redirects_are_passed_back_not_followed(
    proxy, upstream: FakeUpstream, bystander, client: aiohttp.ClientSession
) -> None:
    other, hits = bystander

    async def redirect(request: web.Request) -> web.StreamResponse:
        return web.Response(status=307, headers={"Location": f"http://{other}/steal"})

    proxy.serve(redirect)
    async with client.post(proxy.url + "/v1/chat/completions", data=b"{}", allow_redirects=False) as resp:
        assert resp.status == 307
        assert resp.headers["Location"] == f"http://{other}/steal"
    assert hits == []
    assert len(upstream.seen) == 1
