"""The response head leaves with the body bytes that came with it, and never waits for them.

The upstream here is raw asyncio on port 0, so what it sends in one write is exact: the response
head with the first event, then (later) the last event with the end of the chunked body. The
client counts the data segments its socket received (`tcpi_data_segs_in` of Linux `TCP_INFO`):
one per send of the proxy on loopback. A head the upstream sends alone (no body yet) must reach
the client before the upstream sends anything more.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.conftest import ProxyFactory

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
FIRST = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
LAST = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
_DATA_SEGS_IN = 152  # struct tcp_info: tcpi_data_segs_in (Linux 4.6)

Reply = Callable[[asyncio.StreamWriter], Coroutine[Any, Any, None]]


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


@asynccontextmanager
async def raw_upstream(reply: Reply) -> AsyncIterator[str]:
    """An upstream that reads one request, then lets `reply` write the answer as it likes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        await reader.readexactly(length)
        await reply(writer)
        await reader.read()  # until the proxy closes its side
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def open_request(proxy_url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", int(proxy_url.rsplit(":", 1)[1]))
    body = b'{"model":"m","stream":true}'
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    await writer.drain()
    return reader, writer


def data_segments_in(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    assert len(info) >= _DATA_SEGS_IN + 4, "this kernel's tcp_info has no tcpi_data_segs_in"
    return int(struct.unpack_from("=I", info, _DATA_SEGS_IN)[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts segments with Linux TCP_INFO")
async def test_head_and_first_event_read_together_are_one_send(start_proxy: ProxyFactory) -> None:
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + chunk(FIRST))  # one read for the proxy: the head and the first event
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(chunk(LAST) + b"0\r\n\r\n")  # one read: the last event and the body's end
        await writer.drain()

    async with raw_upstream(reply) as url, start_proxy(upstream=url) as p:
        reader, writer = await open_request(p.url)
        head = await reader.readuntil(b"\r\n\r\n")
        body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
        segments = data_segments_in(writer)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower()
    assert body == chunk(FIRST) + chunk(LAST) + b"0\r\n\r\n"  # byte-exact, framed by the proxy
    # head + first event, last event, final chunk (the proxy's own framing, sent by its handler)
    assert segments == 3, f"the response took {segments} sends, not 3"
    rec = (await p.settled(1))[0]
    assert (rec.status_code, rec.error_type) == (200, "")


async def test_head_that_came_alone_is_sent_at_once(start_proxy: ProxyFactory) -> None:
    client_has_head = asyncio.Event()

    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD)  # the head alone: the proxy must not hold it for a body that may be slow
        await writer.drain()
        await asyncio.wait_for(client_has_head.wait(), 10)  # no body until the client has the head
        writer.write(chunk(FIRST) + chunk(LAST) + b"0\r\n\r\n")
        await writer.drain()

    async with raw_upstream(reply) as url, start_proxy(upstream=url) as p:
        reader, writer = await open_request(p.url)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        client_has_head.set()
        body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert body == chunk(FIRST + LAST) + b"0\r\n\r\n"  # one read upstream, one chunk here
    rec = (await p.settled(1))[0]
    assert (rec.status_code, rec.error_type) == (200, "")
