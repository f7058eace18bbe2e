"""Transparent forwarding over real sockets: bytes, statuses and headers pass exactly."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import logging

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import Proxied, ProxyFactory
from tests.fakes import FakeUpstream, chat_stream, json_handler, stream_handler

# Every case in one process and with `--workers 2` (a supervisor and two worker processes).
pytestmark = pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def post(
    client: aiohttp.ClientSession, url: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, bytes, aiohttp.ClientResponse]:
    async with client.post(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    ) as r:
        return r.status, await r.read(), r


async def test_stream_bytes_are_exact_lf_and_crlf(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    for sep in (b"\n", b"\r\n", b"\r"):
        frames = chat_stream(20, sep=sep)
        proxy.serve(stream_handler(frames, gap=0.001))
        status, body, _ = await post(client, proxy.url + "/v1/chat/completions", {"model": "m", "stream": True})
        assert status == 200
        assert sha(body) == sha(b"".join(frames))
    # CRLF and CR streams are still parsed: tokens were seen
    assert all(r.timing.token_events == 20 for r in await proxy.settled(3))


async def test_request_body_method_path_and_query_reach_upstream_unchanged(
    proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    raw = b'{"model": "m",  "messages": [{"role":"user","content":"h\\u00e9"}]}'
    async with client.put(
        proxy.url + "/v1/custom/a%2Fb?x=1&y=%20z&x=2", data=raw, headers={"Content-Type": "application/json"}
    ) as r:
        assert r.status == 200
    seen = proxy.upstream.seen[-1]
    assert seen.method == "PUT"
    assert seen.path_qs == "/v1/custom/a%2Fb?x=1&y=%20z&x=2"
    assert seen.body == raw
    for method in ("GET", "DELETE", "PATCH", "OPTIONS"):
        async with client.request(method, proxy.url + "/v1/models") as r:
            assert r.status == 200
        assert proxy.upstream.seen[-1].method == method


async def test_upstream_base_path_is_prefixed(start_proxy, client: aiohttp.ClientSession, upstream) -> None:
    async with start_proxy(upstream=upstream.url + "/api") as p:
        async with client.get(p.url + "/v1/models") as r:
            assert r.status == 200
    assert upstream.seen[-1].path_qs == "/api/v1/models"


async def test_headers_seen_upstream(proxy: Proxied) -> None:
    # a raw client, so no header is invented by the test's own client library
    reader, writer = await asyncio.open_connection("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))
    body = b'{"model":"m"}'
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy.example:8787\r\n"
        b"Authorization: Bearer sk-abc\r\nx-api-key: ant-key\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
        b"Keep-Alive: timeout=5\r\nX-Forwarded-For: 9.9.9.9\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    writer.close()
    seen = proxy.upstream.seen[-1].headers
    assert seen["Host"] == proxy.upstream.url.removeprefix("http://")
    assert seen["Authorization"] == "Bearer sk-abc"
    assert seen["x-api-key"] == "ant-key"
    assert seen["X-Forwarded-For"] == "9.9.9.9, 127.0.0.1"
    assert "X-Hop" not in seen and "Keep-Alive" not in seen
    assert "Accept-Encoding" not in seen  # never invented
    assert "User-Agent" not in seen
    assert seen["Content-Length"] == str(len(body))


@pytest.mark.parametrize(
    ("mode", "x_forwarded_for", "forwarded"),
    [
        ("append", ["9.9.9.9, 127.0.0.1"], ["for=8.8.8.8"]),
        ("forwarded", ["9.9.9.9"], ["for=8.8.8.8, for=127.0.0.1"]),
        ("off", ["9.9.9.9"], ["for=8.8.8.8"]),
    ],
)
async def test_forwarded_for_modes_as_the_upstream_sees_them(
    start_proxy: ProxyFactory, mode: str, x_forwarded_for: list[str], forwarded: list[str]
) -> None:
    async with start_proxy(forwarded_for=mode) as p:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(p.url.rsplit(":", 1)[1]))
        writer.write(
            b"GET /v1/models HTTP/1.1\r\nHost: proxy.example\r\nX-Forwarded-For: 9.9.9.9\r\n"
            b"Forwarded: for=8.8.8.8\r\nContent-Length: 0\r\n\r\n"
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    seen = p.upstream.seen[-1].headers
    assert (seen.getall("X-Forwarded-For"), seen.getall("Forwarded")) == (x_forwarded_for, forwarded)


async def test_expect_100_continue_is_answered_and_an_unknown_expectation_refused(proxy: Proxied) -> None:
    port = int(proxy.url.rsplit(":", 1)[1])
    body = b'{"model":"m"}'
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nExpect: 100-continue\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    await writer.drain()
    # The body is sent only once the proxy says to go on (curl waits 1 s for this otherwise).
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200")
    writer.close()
    assert proxy.upstream.seen[-1].body == body
    assert "Expect" not in proxy.upstream.seen[-1].headers

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nExpect: teapot\r\nContent-Length: 0\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 417")
    writer.close()


async def test_gzip_body_is_forwarded_compressed_and_exact(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    payload = gzip.compress(json.dumps({"choices": [], "usage": {"prompt_tokens": 1}}).encode() * 50)

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=payload, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    proxy.serve(handler)
    status, body, resp = await post(
        client, proxy.url + "/v1/chat/completions", {"model": "m"}, headers={"Accept-Encoding": "gzip"}
    )
    assert status == 200 and resp.headers["Content-Encoding"] == "gzip"
    assert sha(body) == sha(payload)
    assert proxy.upstream.seen[-1].headers["Accept-Encoding"] == "gzip"


async def test_error_status_and_body_pass_through(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    error = {
        "error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}
    }
    for n, (status_code, error_type) in enumerate(
        ((401, "auth"), (429, "rate_limited"), (500, "upstream_error"), (400, "bad_request")), start=1
    ):
        proxy.serve(json_handler(error, status=status_code, headers={"x-request-id": "req-1", "retry-after": "3"}))
        status, body, resp = await post(client, proxy.url + "/v1/chat/completions", {"model": "m", "stream": True})
        assert status == status_code
        assert json.loads(body) == error
        assert resp.headers["x-request-id"] == "req-1" and resp.headers["retry-after"] == "3"
        assert (await proxy.settled(n))[-1].error_type == error_type
    proxy.serve(
        json_handler({"error": {"message": "The model `nope` does not exist", "code": "model_not_found"}}, status=404)
    )
    await post(client, proxy.url + "/v1/chat/completions", {"model": "nope"})
    assert (await proxy.settled(5))[-1].error_type == "model_not_found"


async def test_cookies_are_never_kept_between_requests(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok", headers={"Set-Cookie": "session=tenant-a; Path=/"})

    proxy.serve(handler)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as fresh:
        async with fresh.get(proxy.url + "/a") as r:
            assert r.headers["Set-Cookie"].startswith("session=tenant-a")  # passed to the client
        async with fresh.get(proxy.url + "/b") as r:
            assert r.status == 200
    assert "Cookie" not in proxy.upstream.seen[-1].headers  # but never replayed by the proxy


async def test_chunks_are_not_coalesced(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    frames = chat_stream(10)
    proxy.serve(stream_handler(frames, gap=0.05))
    arrivals: list[bytes] = []
    async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
        async for data in r.content.iter_any():
            arrivals.append(data)
    # 50 ms apart upstream: each frame must reach the client on its own, not batched
    assert len(arrivals) >= len(frames) - 1
    assert b"".join(arrivals) == b"".join(frames)


async def test_a_slow_client_slows_the_upstream_instead_of_filling_the_proxy(proxy: Proxied) -> None:
    total = 48 << 20  # well past the kernel's loopback socket buffers on both sides
    block = bytes(range(256)) * 256
    finished: list[float] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        for _ in range(total // len(block)):
            await resp.write(block)
        await resp.write_eof()
        finished.append(asyncio.get_running_loop().time())
        return resp

    proxy.serve(handler)
    reader, writer = await asyncio.open_connection("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))
    writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(1.0)  # the client reads nothing for a second
    resumed = asyncio.get_running_loop().time()
    assert not finished, "the upstream finished while the client read nothing: the proxy buffered it all"
    digest = hashlib.sha256()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    got = 0
    while True:  # chunked framing: size line, data, CRLF
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            break
        digest.update(data[:-2])
        got += size
    writer.close()
    assert got == total and digest.hexdigest() == hashlib.sha256(block * (total // len(block))).hexdigest()
    assert finished and finished[0] > resumed


@pytest.mark.one_process
async def test_an_upstream_ending_in_v1_with_v1_requests_is_warned_once_and_still_forwarded(
    start_proxy: ProxyFactory, upstream: FakeUpstream, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    """`--upstream http://host/v1` + clients on `.../v1` = `/v1/v1/...`: say what to change, once."""
    with caplog.at_level(logging.WARNING, logger="taotrace"):
        async with start_proxy(upstream=upstream.url + "/v1") as p:
            for _ in range(3):
                async with client.post(p.url + "/v1/chat/completions?x=1", json={"model": "m"}) as r:
                    assert r.status == 200
    warnings = [r.getMessage() for r in caplog.records if "ends in /v1" in r.getMessage()]
    assert len(warnings) == 1, warnings
    host = p.url.removeprefix("http://")
    assert f"forwarded to {upstream.url}/v1/v1/chat/completions" in warnings[0]
    assert f"--upstream {upstream.url} (clients keep their base URL http://{host}/v1)" in warnings[0]
    assert f"give the clients the base URL http://{host}." in warnings[0]
    assert [s.path_qs for s in upstream.seen] == ["/v1/v1/chat/completions?x=1"] * 3  # forwarding unchanged


@pytest.mark.one_process
@pytest.mark.parametrize(
    ("base", "path"), [("", "/v1/chat/completions"), ("/v1", "/chat/completions"), ("/api", "/v1/models")]
)
async def test_no_warning_when_the_paths_do_not_double(
    start_proxy: ProxyFactory,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    base: str,
    path: str,
) -> None:
    with caplog.at_level(logging.WARNING, logger="taotrace"):
        async with start_proxy(upstream=upstream.url + base) as p:
            async with client.get(p.url + path) as r:
                assert r.status == 200
    assert not [r for r in caplog.records if "forwarded to" in r.getMessage()]


@pytest.mark.parametrize(
    "target",
    [
        "/../admin", "/v1/../../admin", "/v1/./models", "/v1/%2e%2e/admin", "/v1/..%2fadmin", "/v1/%2E%2E", "/..",
        "/v1\\..\\..\\admin", "/v1/%5c..%5cadmin", "/v1/..;/admin", "/v1/%2e%2e;x/admin", "/v1/%252e%252e/admin",
    ],
)  # fmt: skip
async def test_a_path_that_climbs_out_of_the_base_is_refused(start_proxy, upstream, target: str) -> None:
    """Dot segments would leave the upstream's base path (`--upstream …/api`) at an upstream that
    resolves them: a 400, never forwarded."""
    async with start_proxy(upstream=upstream.url + "/api") as p:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(p.url.rsplit(":", 1)[1]))
        writer.write(b"GET %s HTTP/1.1\r\nHost: p\r\nContent-Length: 0\r\n\r\n" % target.encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        body = await reader.read(4096)
        writer.close()
    assert head.startswith(b"HTTP/1.1 400"), head
    assert b"bad_request" in body and b"'..' segments" in body
    assert not upstream.seen


@pytest.mark.parametrize(
    "target",
    [
        "/v1/models/gpt-4.1", "/v1/files/a..b", "/v1/x%20y", "/v1/models?after=..", "/v1/files/a%2Fb",
        "/v1beta/models/gemini-1.5-pro:generateContent", "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
        "/v1/files/..a", "/v1/;x",
    ],
)  # fmt: skip
async def test_dots_inside_a_segment_or_the_query_pass(start_proxy, upstream, target: str) -> None:
    async with start_proxy(upstream=upstream.url + "/api") as p:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(p.url.rsplit(":", 1)[1]))
        writer.write(b"GET %s HTTP/1.1\r\nHost: p\r\nContent-Length: 0\r\n\r\n" % target.encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200"), head
    assert upstream.seen[-1].path_qs == "/api" + target
