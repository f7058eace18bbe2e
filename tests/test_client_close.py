"""Clients that close the connection as soon as a stream's terminal event arrives (the sync OpenAI
SDK, Codex CLI, GuideLLM…), before the upstream's end of body: a clean end, not `client_abort`,
and the upstream connection is kept when the rest of the body comes within the bounds."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.trace import StatusCode

from proxy.exchange.record import RequestRecord
from tests.conftest import Proxied, ProxyFactory
from tests.fakes import (
    FakeUpstream,
    chat_stream,
    json_handler,
    messages_stream,
    named,
    responses_stream,
    sse,
    stream_handler,
    usage_chunk,
)


@dataclass(frozen=True)
class Case:
    """One dialect: where to send it, what the upstream streams, what usage it reports."""

    path: str
    frames: list[bytes]
    output_tokens: int


def completions_stream() -> list[bytes]:
    chunks = [
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": "m",
            "choices": [{"text": w, "index": 0, "finish_reason": "stop" if w == "c" else None}],
        }
        for w in ["a", "b", "c"]
    ]
    return sse(*chunks, {**usage_chunk(5, 3), "object": "text_completion"})


CASES = {
    "chat_completions": Case("/v1/chat/completions", chat_stream(5), 5),
    "completions": Case("/v1/completions", completions_stream(), 3),
    "responses": Case("/v1/responses", responses_stream(), 4),
    "messages": Case("/v1/messages", messages_stream(), 3),
}
BODY = {"model": "m", "stream": True}


async def close_after(client: aiohttp.ClientSession, url: str, marker: bytes) -> tuple[bytes, float]:
    """Read until `marker` (the terminal event, whole) has arrived, then close the connection at
    once, as the sync OpenAI SDK does after `[DONE]`. Returns what was read and when (the proxy's
    clock: perf_counter)."""
    received = b""
    async with client.post(url, json=BODY) as r:
        assert r.status == 200
        async for data in r.content.iter_any():
            received += data
            if marker in received:
                seen = time.perf_counter()
                r.close()  # the body is not over: this closes the connection
                return received, seen
    raise AssertionError(f"the stream ended without {marker!r}")


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


async def record(p: Proxied, n: int) -> RequestRecord:
    await eventually(lambda: len(p.records) >= n)
    return p.records[n - 1]


def root_span(p: Proxied) -> object:
    return [s for s in p.spans() if s.name not in ("network", "prefill_wait", "decode")][-1]


def assert_clean(p: Proxied, rec: RequestRecord, case: Case, seen: float) -> None:
    assert (rec.status_code, rec.error_type) == (200, "")
    assert rec.usage.output_tokens == case.output_tokens and rec.usage_source == "reported"
    assert rec.timing.tpot is not None and rec.timing.itl
    assert rec.timing.end <= seen  # timed to the last byte written, not to the close
    root = root_span(p)
    assert root.status.status_code != StatusCode.ERROR and "error.type" not in root.attributes  # type: ignore[attr-defined]
    assert (
        p.srv.registry.get_sample_value("taotrace_in_flight_requests", {"upstream": rec.upstream, "api": rec.api}) == 0
    )


async def second_request_reused(p: Proxied, client: aiohttp.ClientSession, path: str) -> bool:
    async with client.post(p.url + path, json=BODY) as r:
        await r.read()
    rec = await record(p, 2)
    assert rec.error_type == ""
    network = p.spans("network")[-1]
    assert network.attributes["taotrace.connection.reused"] is rec.timing.connection_reused
    return bool(rec.timing.connection_reused)


@pytest.mark.parametrize("linger_ms", [0, 40, 500])
@pytest.mark.parametrize("api", list(CASES))
async def test_close_after_terminal_event_is_a_clean_end_and_keeps_the_connection(
    api: str, linger_ms: int, start_proxy: ProxyFactory, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    case = CASES[api]
    upstream.handler = stream_handler(case.frames, gap=0.005, linger=linger_ms / 1000)
    async with start_proxy() as p:
        received, seen = await close_after(client, p.url + case.path, case.frames[-1])
        assert received == b"".join(case.frames)
        rec = await record(p, 1)
        assert rec.api == api
        assert_clean(p, rec, case, seen)
        await eventually(lambda: len(upstream.completed) == 1)  # read to its end, not cut
        assert upstream.disconnected == []
        await asyncio.sleep(0.1)  # the end of body reaches the proxy; the connection goes back to the pool
        assert await second_request_reused(p, client, case.path)


@pytest.mark.parametrize("api", ["chat_completions", "messages"])
async def test_rest_of_body_slower_than_the_bound_closes_the_connection(
    api: str, start_proxy: ProxyFactory, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    case = CASES[api]
    upstream.handler = stream_handler(case.frames, gap=0.005, linger=3.0)  # cancelled at the bound: no wait
    async with start_proxy(upstream_discard_seconds=0.15) as p:
        _, seen = await close_after(client, p.url + case.path, case.frames[-1])
        closed_at = asyncio.get_running_loop().time()
        assert_clean(p, await record(p, 1), case, seen)
        await eventually(lambda: bool(upstream.disconnected))  # the proxy gave up on the rest: closed
        assert upstream.disconnected[0] - closed_at < 2.0  # at the bound, not at the upstream's end (3 s)
        upstream.handler = stream_handler(case.frames)
        assert not await second_request_reused(p, client, case.path)


async def test_rest_of_body_larger_than_the_bound_closes_the_connection(
    start_proxy: ProxyFactory, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    frames = chat_stream(5)

    async def padded(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame in frames:
            await resp.write(frame)
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)  # the client is gone by now
        for _ in range(10):
            await resp.write(b": " + b"x" * 16384 + b"\n\n")  # comments after [DONE]: 160 KiB in all
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        await resp.write_eof()
        return resp

    upstream.handler = padded
    async with start_proxy(upstream_discard_bytes=64 * 1024) as p:
        _, seen = await close_after(client, p.url + "/v1/chat/completions", frames[-1])
        assert_clean(p, await record(p, 1), CASES["chat_completions"], seen)
        await eventually(lambda: bool(upstream.disconnected))
        upstream.handler = stream_handler(frames)
        assert not await second_request_reused(p, client, "/v1/chat/completions")


async def test_garbage_after_the_terminal_event_closes_the_connection_request_still_clean(
    start_proxy: ProxyFactory, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    frames = chat_stream(5)

    async def garbage(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame in frames:
            await resp.write(frame)
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)
        assert request.transport is not None
        request.transport.write(b"zz-not-a-chunk-size\r\n\r\n")  # broken chunked framing
        await asyncio.sleep(0.5)
        return resp

    upstream.handler = garbage
    async with start_proxy() as p:
        _, seen = await close_after(client, p.url + "/v1/chat/completions", frames[-1])
        assert_clean(p, await record(p, 1), CASES["chat_completions"], seen)
        await eventually(lambda: bool(upstream.disconnected))  # the proxy dropped the broken connection
        upstream.handler = stream_handler(frames)
        assert not await second_request_reused(p, client, "/v1/chat/completions")


async def test_upstream_cut_after_the_terminal_event_is_a_success(
    proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    """The client still reads: it sees the cut (as it would without the proxy), but it has the
    whole answer, so the request is not a `stream_cut`."""
    frames = chat_stream(5)

    async def cut(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame in frames:
            await resp.write(frame)
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)
        assert request.transport is not None
        request.transport.close()  # no terminating chunk
        return resp

    proxy.serve(cut)
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with client.post(proxy.url + "/v1/chat/completions", json=BODY) as r:
            async for data in r.content.iter_any():
                received += data
    done = time.perf_counter()
    assert received == b"".join(frames)
    rec = await record(proxy, 1)
    assert_clean(proxy, rec, CASES["chat_completions"], done)
    assert rec.timing.end < done - 0.05  # the last byte, not the cut 100 ms later


async def test_terminal_event_split_across_reads(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    frames = chat_stream(5)
    split = frames[:-1] + [b"data: [DO", b"NE]\n", b"\n"]  # each its own write, 20 ms apart
    proxy.serve(stream_handler(split, gap=0.02, linger=0.3))
    _, seen = await close_after(client, proxy.url + "/v1/chat/completions", b"data: [DONE]\n\n")
    assert_clean(proxy, await record(proxy, 1), CASES["chat_completions"], seen)
    await eventually(lambda: len(proxy.upstream.completed) == 1)
    assert proxy.upstream.disconnected == []


async def test_response_failed_is_the_streams_own_error_not_an_abort(
    proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    frames = responses_stream()[:-1]
    failed = {"id": "resp_1", "object": "response", "model": "gpt-4o-mini", "status": "failed", "output": [],
              "error": {"code": "server_error", "message": "boom"}}  # fmt: skip
    frames.append(named("response.failed", {"type": "response.failed", "sequence_number": 10, "response": failed}))
    proxy.serve(stream_handler(frames, gap=0.005, linger=0.3))
    await close_after(client, proxy.url + "/v1/responses", frames[-1])
    rec = await record(proxy, 1)
    assert (rec.status_code, rec.error_type) == (200, "stream_error")
    root = root_span(proxy)
    assert root.attributes["error.type"] == "stream_error"  # type: ignore[attr-defined]
    await eventually(lambda: len(proxy.upstream.completed) == 1)  # the connection was still kept


ERROR_EVENTS = {
    "chat_completions": b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n',
    "messages": named("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
}


@pytest.mark.parametrize("api", list(ERROR_EVENTS))
async def test_close_on_the_streams_own_error_records_that_error_not_an_abort(
    api: str, proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    """The OpenAI SDK raises on an error chunk and closes: the upstream failed the request (the
    error-ratio alerts must say so), the client did not abort it. The upstream is still closed."""
    case = CASES[api]
    frames = [*case.frames[:3], ERROR_EVENTS[api]]
    proxy.serve(stream_handler(frames, gap=0.005, linger=2.0))  # no terminal event, no end
    await close_after(client, proxy.url + case.path, frames[-1])
    rec = await record(proxy, 1)
    assert (rec.status_code, rec.error_type) == (200, "stream_error")
    assert root_span(proxy).attributes["error.type"] == "stream_error"  # type: ignore[attr-defined]
    await eventually(lambda: bool(proxy.upstream.disconnected))  # not done: the upstream is let go


@pytest.mark.parametrize("api", ["chat_completions", "messages"])
async def test_close_before_the_terminal_event_is_still_an_abort(
    api: str, proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    """Every token and the usage arrived, but not the terminal event: the client left early."""
    case = CASES[api]
    frames = case.frames
    proxy.serve(_Paused(frames, 2.0))
    await close_after(client, proxy.url + case.path, frames[-2])
    closed_at = asyncio.get_running_loop().time()
    rec = await record(proxy, 1)
    assert rec.error_type == "client_abort"
    await eventually(lambda: bool(proxy.upstream.disconnected))
    assert proxy.upstream.disconnected[0] - closed_at < 1.0  # cancelled at once, as before


class _Paused:
    """Streams every frame but the last, waits, then the last."""

    def __init__(self, frames: Sequence[bytes], pause: float) -> None:
        self.frames, self.pause = list(frames), pause

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame in self.frames[:-1]:
            await resp.write(frame)
            await asyncio.sleep(0.005)
        await asyncio.sleep(self.pause)
        await resp.write(self.frames[-1])
        await resp.write_eof()
        return resp


async def test_connection_slot_is_held_until_the_rest_is_read(
    start_proxy: ProxyFactory, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    """With a connection cap, the next request waits for the discarded rest and reuses the
    connection instead of opening one past the cap."""
    frames = chat_stream(5)
    upstream.handler = stream_handler(frames, gap=0.005, linger=0.3)
    async with start_proxy(max_connections=1) as p:
        await close_after(client, p.url + "/v1/chat/completions", frames[-1])
        upstream.handler = stream_handler(frames)
        assert await second_request_reused(p, client, "/v1/chat/completions")
        assert (p.records[1].timing.pool_wait or 0.0) > 0.1


async def test_shutdown_cancels_the_background_read(
    start_proxy: ProxyFactory, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    frames = chat_stream(5)
    upstream.handler = stream_handler(frames, gap=0.005, linger=10.0)
    async with start_proxy(upstream_discard_seconds=30.0) as p:
        _, seen = await close_after(client, p.url + "/v1/chat/completions", frames[-1])
        assert_clean(p, await record(p, 1), CASES["chat_completions"], seen)
        started = time.monotonic()
    assert time.monotonic() - started < 3.0  # the 10 s rest is not waited for
    await eventually(lambda: bool(upstream.disconnected))
    assert len(p.records) == 1


async def test_non_streaming_client_closing_after_the_whole_body_is_a_success(proxy: Proxied) -> None:
    """A raw client that resets the connection as soon as the JSON body is complete."""
    body = {"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
            "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}  # fmt: skip
    proxy.serve(json_handler(body))
    host, port = proxy.url.removeprefix("http://").split(":")
    payload = json.dumps({"model": "m"}).encode()
    expected = json.dumps(body).encode()
    for _ in range(5):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(payload), payload)
        )
        got = b""
        while expected not in got:
            got += await reader.read(65536)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        writer.transport.abort()
    await eventually(lambda: len(proxy.records) == 5)
    assert [r.error_type for r in proxy.records] == [""] * 5
    assert all(r.usage.output_tokens == 1 for r in proxy.records)


@pytest.mark.parametrize("terminal_sent", [True, False])
async def test_drain_deadline_after_the_terminal_event_is_not_shutdown(
    terminal_sent: bool, start_proxy: ProxyFactory, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    """SIGTERM's drain deadline cuts a stream whose upstream still lingers: after the terminal
    event the client had the whole answer (a success); before it, the request is `shutdown`."""
    frames = chat_stream(5)
    if terminal_sent:
        upstream.handler = stream_handler(frames, gap=0.005, linger=10.0)
    else:
        upstream.handler = _Paused(frames, 10.0)

    async def read() -> bytes:
        received = b""
        try:
            async with client.post(p.url + "/v1/chat/completions", json=BODY) as r:
                async for data in r.content.iter_any():
                    received += data
        except aiohttp.ClientPayloadError:
            pass  # cut by the drain, as it should be
        return received

    async with start_proxy(drain_seconds=0.3) as p:
        reading = asyncio.ensure_future(read())
        await eventually(lambda: len(upstream.seen) == 1)
        await asyncio.sleep(0.3)  # every frame but the lingering part has been relayed
    received = await asyncio.wait_for(reading, 5)
    assert received.endswith(b"data: [DONE]\n\n") is terminal_sent
    rec = await record(p, 1)
    assert rec.error_type == ("" if terminal_sent else "shutdown")
