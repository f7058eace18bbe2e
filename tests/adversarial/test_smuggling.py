"""Request smuggling, framing tricks and oversize input, written byte by byte on a raw socket."""

from __future__ import annotations

import json

import aiohttp
import pytest

from tests.adversarial.util import CHAT, raw_request
from tests.bars import TIMING_BARS, fired_on_time
from tests.fakes import FakeUpstream

CANARY = b"sk-SMUGGLE-CANARY-7f3a"
HEAD = b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + CANARY + b"\r\n"

REFUSED = {
    "cl-and-te": HEAD + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "te-and-cl": HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
    "duplicate-cl": HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}x",
    "cl-list": HEAD + b"Content-Length: 2, 2\r\n\r\n{}",
    "cl-negative": HEAD + b"Content-Length: -1\r\n\r\n{}",
    "cl-plus": HEAD + b"Content-Length: +2\r\n\r\n{}",
    "cl-hex": HEAD + b"Content-Length: 0x2\r\n\r\n{}",
    "te-chunked-chunked": HEAD + b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    "te-chunked-not-last": HEAD + b"Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
    "te-xchunked": HEAD + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "te-space-before-colon": HEAD + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "cl-space-before-colon": HEAD + b"Content-Length : 2\r\n\r\n{}",
    "obs-fold": HEAD + b"X-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\n{}",
    "nul-in-value": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
    + CANARY
    + b"\x00\r\nContent-Length: 2\r\n\r\n{}",
    "bare-cr-in-value": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
    + CANARY
    + b"\rX: y\r\nContent-Length: 2\r\n\r\n{}",
    "bare-lf-in-value": HEAD + b"X-A: a\nX-B: b\r\nContent-Length: 2\r\n\r\n{}",
    "bad-chunk-size": HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "chunk-size-overflow": HEAD + b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff1\r\n{}\r\n0\r\n\r\n",
    "chunk-ext-lf": HEAD + b"Transfer-Encoding: chunked\r\n\r\n2;a\nb\r\n{}\r\n0\r\n\r\n",
    "space-in-target": b"GET /v1/models HTTP/1.1 x\r\nHost: x\r\n\r\n",
    "bad-method": b"G\x00T /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
async def test_ambiguous_framing_is_400_and_nothing_reaches_the_upstream(
    proxy, upstream: FakeUpstream, name: str
) -> None:
    out = await raw_request(proxy.url, REFUSED[name])
    status = int(out.split(b" ", 2)[1]) if out.startswith(b"HTTP/") else None
    assert status == 400, out[:300]
    assert upstream.seen == []
    assert CANARY not in out  # the error body never quotes the request
    body = out.split(b"\r\n\r\n", 1)[1]
    assert json.loads(body)["error"]["message"].startswith("taotrace: malformed HTTP request")


async def test_smuggled_second_request_is_never_forwarded(proxy, upstream: FakeUpstream) -> None:
    # CL.TE: a front end honouring Content-Length would see one request; one honouring TE, two.
    data = (
        HEAD
        + b"Content-Length: 35\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    out = await raw_request(proxy.url, data)
    assert out.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400"))
    assert out.count(b"HTTP/1.") == 1  # exactly one answer, then the connection is closed
    assert upstream.seen == []


@pytest.mark.parametrize(
    "data",
    [
        HEAD.replace(b"Bearer ", b"Bearer " + b"A" * 20_000) + b"Content-Length: 2\r\n\r\n{}",
        b"GET /v1/models?key=" + CANARY + b"B" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        HEAD + b"X-Big: " + b"C" * 20_000 + b"\r\nContent-Length: 2\r\n\r\n{}",
    ],
    ids=["long-authorization", "long-target", "long-header"],
)
async def test_oversize_header_or_target_is_431_with_a_clear_message(
    proxy, upstream: FakeUpstream, data: bytes
) -> None:
    out = await raw_request(proxy.url, data)
    assert out.split(b" ", 2)[1] == b"431", out[:200]
    assert CANARY not in out and b"AAAA" not in out and b"BBBB" not in out and b"CCCC" not in out
    assert b"too long" in out
    assert upstream.seen == []


async def test_too_many_headers_are_refused(proxy, upstream: FakeUpstream) -> None:
    data = HEAD + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"Content-Length: 2\r\n\r\n{}"
    out = await raw_request(proxy.url, data)
    assert out.split(b" ", 2)[1] in (b"400", b"431"), out[:200]
    assert upstream.seen == []


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_oversize_body_is_413_with_a_clear_message(
    start_proxy, upstream: FakeUpstream, client: aiohttp.ClientSession, chunked: bool
) -> None:
    body = b'{"model": "m", "pad": "' + b"x" * 200_000 + b'"}'

    async def gen():
        for i in range(0, len(body), 10_000):
            yield body[i : i + 10_000]

    async with start_proxy(max_body_bytes=100_000) as p:
        async with client.post(p.url + CHAT, data=gen() if chunked else body) as resp:
            status, text = resp.status, await resp.text()
    assert status == 413
    assert "exceeds the proxy's limit of 100000 bytes" in text
    assert upstream.seen == []
    assert p.records[0].error_type == "request_too_large"


@pytest.mark.parametrize(
    "head", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"], ids=["silent", "half-head"]
)
@TIMING_BARS
async def test_slow_or_silent_clients_are_dropped(
    start_proxy, upstream: FakeUpstream, head: bytes, strict: bool
) -> None:
    """Slowloris: a connection that never finishes its request head is closed, not held for an hour."""
    import asyncio
    import time

    async with start_proxy(client_keepalive=1.0) as p:
        host, port = p.url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head)
        t = time.perf_counter()
        async with asyncio.timeout(30):
            await reader.read()  # returns at EOF: the proxy closed the connection
        elapsed = time.perf_counter() - t
        writer.close()
    fired_on_time(elapsed, 1.0, strict=strict, early=0.1, late=1.5)  # not held for the hour a slowloris wants
    assert upstream.seen == []


async def test_client_keepalive_does_not_cut_long_streams(start_proxy, client: aiohttp.ClientSession) -> None:
    from tests.fakes import chat_stream, stream_handler

    frames = chat_stream(8)
    async with start_proxy(client_keepalive=0.5) as p:
        p.serve(stream_handler(frames, gap=0.25))  # a 2 s stream, 4x the keep-alive timeout
        async with client.post(p.url + "/v1/chat/completions", data=b"{}") as resp:
            assert await resp.read() == b"".join(frames)
