"""Upstreams and clients that do not say what they promise: everything is forwarded untouched,
telemetry degrades, nothing raises."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from tests.adversarial.util import CHAT, read_stream, sample
from tests.fakes import (
    FakeUpstream,
    chat_chunk,
    chat_stream,
    named,
    sse,
    stream_handler,
)

TOKENS = sse(chat_chunk("a"), chat_chunk("b"), chat_chunk(finish="stop"), done=False)

LIES: dict[str, tuple[list[bytes], int]] = {
    # name: (frames, token events the proxy should still count); 0 tokens: the stream carried no
    # readable end either (stream_incomplete), the others end with a finish_reason
    "invalid-json": ([b"data: {not json\n\n", b'data: {"choices": [\n\n', *TOKENS, b"data: [DONE]\n\n"], 2),
    "json-of-the-wrong-shape": (
        [
            b"data: [1,2]\n\n",
            b'data: "s"\n\n',
            b'data: {"choices": 5}\n\n',
            b'data: {"choices": [{"delta": 7}]}\n\n',
            b'data: {"choices": [{"delta": {"content": 9}}]}\n\n',
            b'data: {"usage": "many"}\n\n',
            *TOKENS,
        ],
        2,
    ),
    "unknown-events": ([named("x-vendor.thing", {"a": 1}), b"event: \n\n", b"retry: 10\n\n", *TOKENS], 2),
    "bom": ([b"\xef\xbb\xbf" + TOKENS[0], *TOKENS[1:]], 2),
    "bom-split": ([b"\xef", b"\xbb", b"\xbf" + TOKENS[0], *TOKENS[1:]], 2),
    "no-done": (TOKENS, 2),
    "no-final-blank-line": ([*TOKENS, b'data: {"choices": [{"delta": {"content": "c"}}]}\n'], 2),
    "comments-only": ([b": keep-alive\n\n"] * 50, 0),
    "nul-and-binary": ([b"data: \x00\xff\xfe\n\n", b"id: \x00\n\n", *TOKENS], 2),
    "cr-only-lines": ([t.replace(b"\n", b"\r") for t in TOKENS], 2),
    "event-over-1MiB": ([TOKENS[0], b'data: {"pad": "' + b"x" * (3 << 20) + b'"}\n\n', *TOKENS[1:]], 2),
    "line-over-1MiB-in-small-reads": ([TOKENS[0], b"data: ", *([b"z" * 1000] * 2100), b"\n\n", *TOKENS[1:]], 2),
    "no-blank-line-ever": ([b"data: " + b"q" * 1000 + b"\n"] * 3000, 0),
    "no-newline-ever": ([b"r" * 65536] * 64, 0),
    "usage-lies": (
        [*TOKENS, b'data: {"choices": [], "usage": {"completion_tokens": -5, "prompt_tokens": 1e99}}\n\n'],
        2,
    ),
}


@pytest.mark.parametrize("name", sorted(LIES))
async def test_lying_streams_are_forwarded_untouched(proxy, client: aiohttp.ClientSession, name: str) -> None:
    frames, tokens = LIES[name]
    proxy.serve(stream_handler(frames))
    status, body = await read_stream(client, proxy.url + CHAT)
    assert status == 200
    assert body == b"".join(frames)
    (rec,) = proxy.records
    assert rec.error_type == ("" if tokens else "stream_incomplete")
    assert rec.timing.token_events == tokens
    assert rec.status_code == 200


async def test_a_mid_stream_error_event_is_recorded_and_forwarded(proxy, client: aiohttp.ClientSession) -> None:
    frames = [*TOKENS, b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n']
    proxy.serve(stream_handler(frames))
    status, body = await read_stream(client, proxy.url + CHAT)
    assert (status, body) == (200, b"".join(frames))
    assert proxy.records[0].error_type == "stream_error"


async def test_wrong_content_type_and_compressed_bodies_are_not_parsed(proxy, client: aiohttp.ClientSession) -> None:
    frames = chat_stream(3)
    proxy.serve(stream_handler(frames, content_type="application/octet-stream"))
    assert await read_stream(client, proxy.url + CHAT) == (200, b"".join(frames))
    gz = bytes(range(256)) * 10
    proxy.serve(stream_handler([gz], headers={"Content-Encoding": "gzip"}))
    assert await read_stream(client, proxy.url + CHAT) == (200, gz)
    assert [r.error_type for r in proxy.records] == ["", ""]


async def test_invalid_upstream_http_is_a_502(proxy, client: aiohttp.ClientSession) -> None:
    async def garbage(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        assert transport is not None
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!")
        await asyncio.sleep(0.2)
        transport.close()
        return web.Response()

    proxy.serve(garbage)
    status, body = await read_stream(client, proxy.url + CHAT)
    assert status == 502
    assert json.loads(body)["error"]["type"] == "upstream_error"


BODIES = {
    "not-json": b"this is not json",
    "json-array": b"[1, 2, 3]",
    "no-model": b'{"messages": [], "stream": true}',
    "model-not-a-string": b'{"model": {"$ne": 1}, "stream": true}',
    "stream-a-string": b'{"model": "gpt-4o-mini", "stream": "yes"}',
    "stream-a-number": b'{"model": "gpt-4o-mini", "stream": 1}',
    "huge-model": b'{"model": "' + b"m" * 100_000 + b'", "stream": true}',
    "control-chars-model": b'{"model": "a\\nb\\u0000c", "stream": true}',
    "invalid-utf8": b'{"model": "\xff\xfe", "stream": true}',
    "deeply-nested": b'{"model": "m", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(BODIES))
async def test_odd_request_bodies_are_forwarded_and_telemetry_degrades(
    proxy, upstream: FakeUpstream, registry, client: aiohttp.ClientSession, name: str
) -> None:
    body = BODIES[name]
    proxy.serve(stream_handler(chat_stream(2)))
    async with client.post(proxy.url + CHAT, data=body, headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200
        await resp.read()
    assert upstream.seen[0].body == body  # the upstream decides, not us
    (rec,) = proxy.records
    assert rec.error_type == ""
    assert rec.model is None or name in ("stream-a-string", "stream-a-number")
    if rec.model is None:
        labels = {
            "upstream": "127.0.0.1",
            "api": "chat_completions",
            "model": "unknown",
            "status_code": "200",
            "error_type": "",
        }
        assert sample(registry, "taotrace_requests_total", **labels) == 1


async def test_other_paths_are_forwarded_and_counted_as_other(proxy, upstream: FakeUpstream, registry, client) -> None:
    async with client.put(proxy.url + "/v2/some/thing?x=1", data=b"\x00\x01binary") as resp:
        assert resp.status == 200
    assert upstream.seen[0].body == b"\x00\x01binary"
    labels = {"upstream": "127.0.0.1", "api": "other", "model": "unknown", "status_code": "200", "error_type": ""}
    assert sample(registry, "taotrace_requests_total", **labels) == 1
