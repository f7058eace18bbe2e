"""The upstream HTTP/1.1 client (`proxy/upstream/`) against scripted raw-socket servers.

Each server is a real asyncio server on port 0 that answers with exact bytes, so framing edge
cases (HEAD, 1xx, EOF-delimited bodies, cuts, garbage, stale keep-alive connections) are what
the wire says, not what a framework would produce.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trustme
from aiohttp import web
from yarl import URL

from proxy.errors import BodyFailure, UpstreamBroken, UpstreamTimeout, UpstreamUnreachable
from proxy.exchange.timing import PhaseClock
from proxy.upstream import UpstreamPool, UpstreamResponse

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"


class Raw:
    """A raw server: `script(reader, writer, n)` answers the n-th connection (0-based)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.closed: list[int] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = self.connections
        self.connections += 1
        try:
            await self.script(reader, writer, n)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed.append(n)
            writer.close()

    async def __aenter__(self) -> Raw:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request head plus its Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def answer_each(*responses: bytes, hold: bool = True) -> Script:
    """Answer the requests of every connection with `responses` in turn, then wait or close."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        for response in responses:
            await read_request(reader)
            writer.write(response)
            await writer.drain()
        if hold:
            await reader.read()  # until the client closes

    return script


@asynccontextmanager
async def pool_for(port: int, scheme: str = "http", **kw: object) -> AsyncIterator[UpstreamPool]:
    opts: dict[str, object] = {"connect_timeout": 2.0, "read_timeout": 5.0, "keepalive": 4.0} | kw
    pool = UpstreamPool(URL(f"{scheme}://127.0.0.1:{port}"), **opts)  # type: ignore[arg-type]
    try:
        yield pool
    finally:
        await pool.close()


async def fetch(
    pool: UpstreamPool, method: str = "POST", body: bytes = b"{}"
) -> tuple[UpstreamResponse, bytes, PhaseClock]:
    """A request and its whole body through `relay`."""
    phase = PhaseClock(0.0)
    resp = await pool.request(method, "/v1/x", [("Content-Type", "application/json")], body, phase)
    got = bytearray()

    def sink(chunk: bytes) -> bool:
        got.extend(chunk)
        return False

    async def drained() -> None:
        return None

    try:
        await resp.relay(sink, drained)
    finally:
        resp.close()
    return resp, bytes(got), phase


async def test_connections_are_reused_and_timed() -> None:
    async with Raw(answer_each(OK, OK, OK)) as srv, pool_for(srv.port) as pool:
        seen = [await fetch(pool) for _ in range(3)]
        assert [(r.status, body, p.reused) for r, body, p in seen] == [
            (200, b"hello", False), (200, b"hello", True), (200, b"hello", True)
        ]  # fmt: skip
        assert srv.connections == 1
        assert seen[0][2].connect is not None and seen[0][2].connect > 0
        assert seen[1][2].connect is None  # a reused connection was not connected for this request
        assert all(p.t_sent is not None for _, _, p in seen)


async def test_request_head_is_exact_and_invents_nothing() -> None:
    seen: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        seen.append(await read_request(reader))
        writer.write(OK)
        await reader.read()

    async with Raw(script) as srv, pool_for(srv.port) as pool:
        await fetch(pool, body=b'{"a":1}')
    assert seen == [
        f"POST /v1/x HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: 7\r\n\r\n".encode()
        + b'{"a":1}'
    ]


def test_request_head_lines() -> None:
    """Request line, Host, our own lines, the headers in order (repeats kept), then the framing."""
    from proxy.upstream._request import request_head

    odd = b"caf\xc3\xa9 \xff".decode("utf-8", "surrogateescape")  # bytes as the client sent them
    head = request_head("POST", "/v1/x?a=1", "h:81", [("A", "1"), ("a", "2"), ("X-Odd", odd)], b"xy", "Via: p\r\n")
    assert (
        head
        == b"POST /v1/x?a=1 HTTP/1.1\r\nHost: h:81\r\nVia: p\r\nA: 1\r\na: 2\r\nX-Odd: caf\xc3\xa9 \xff\r\nContent-Length: 2\r\n\r\n"
    )
    assert request_head("GET", "/", "h", [], b"") == b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
    assert request_head("POST", "/", "h", [], b"") == b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"


async def test_keepalive_expiry_closes_idle_connections() -> None:
    async with Raw(answer_each(OK, OK)) as srv, pool_for(srv.port, keepalive=0.2) as pool:
        await fetch(pool)
        await asyncio.sleep(0.5)
        assert srv.closed == [0]  # closed by the pool, not left open for the upstream to time out
        _, body, phase = await fetch(pool)
        assert body == b"hello" and phase.reused is False and srv.connections == 2


async def test_connection_close_and_http10_are_not_reused() -> None:
    close = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    http10 = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
    for answer in (close, http10):
        async with Raw(answer_each(answer, answer)) as srv, pool_for(srv.port) as pool:
            await fetch(pool)
            _, body, phase = await fetch(pool)
            assert body == b"ok" and phase.reused is False and srv.connections == 2


async def test_body_until_eof_is_complete_not_cut() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        writer.close()

    async with Raw(script) as srv, pool_for(srv.port) as pool:
        resp, body, _ = await fetch(pool)
        assert resp.status == 200 and body == b"data: 1\n\ndata: [DONE]\n\n"


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-part",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    ],
    ids=["content-length", "chunked"],
)
async def test_a_body_cut_short_is_a_stream_cut(answer: bytes) -> None:
    async with Raw(answer_each(answer, hold=False)) as srv, pool_for(srv.port) as pool:
        with pytest.raises(BodyFailure) as info:
            await fetch(pool)
        assert info.value.error_type == "stream_cut"


async def test_bad_chunk_framing_mid_body_is_a_stream_cut() -> None:
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"
    async with Raw(answer_each(answer)) as srv, pool_for(srv.port) as pool:
        with pytest.raises(BodyFailure) as info:
            await fetch(pool)
        assert info.value.error_type == "stream_cut"


@pytest.mark.parametrize(
    "answer,said",
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n", "sent an invalid HTTP response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nok", "sent an invalid HTTP response"),
        (b"HTTP/1.1 200 OK\r\nX-Secret: sk-live-abcdef\r\nBad Header\r\n\r\n", "sent an invalid HTTP response"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", "sent a (header line|response head) over"),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            "switched protocols, which the proxy does not relay",
        ),
    ],
    ids=["not-http", "two-lengths", "bad-header", "huge-head", "upgrade"],
)
async def test_an_invalid_response_head_is_502_with_our_own_words(answer: bytes, said: str) -> None:
    async with Raw(answer_each(answer)) as srv, pool_for(srv.port) as pool:
        with pytest.raises(UpstreamBroken) as info:
            await fetch(pool)
    message = info.value.message
    assert re.fullmatch(f"upstream 127.0.0.1:{srv.port} {said}.*", message)
    assert "sk-live" not in message and "SSH" not in message


async def test_closed_before_responding_is_502() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)

    async with Raw(script) as srv, pool_for(srv.port) as pool:
        with pytest.raises(UpstreamBroken, match="closed the connection before responding"):
            await fetch(pool)


async def test_interim_1xx_responses_are_skipped() -> None:
    answer = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n" + OK
    async with Raw(answer_each(answer, OK)) as srv, pool_for(srv.port) as pool:
        resp, body, _ = await fetch(pool)
        assert (resp.status, body, resp.header("link")) == (200, b"hello", "")
        _, body, phase = await fetch(pool)
        assert body == b"hello" and phase.reused


async def test_head_response_with_a_length_does_not_wait_for_a_body() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 12345\r\n\r\n"
    async with Raw(answer_each(answer, OK)) as srv, pool_for(srv.port) as pool:
        resp, body, _ = await asyncio.wait_for(fetch(pool, "HEAD", b""), 2)
        assert resp.status == 200 and resp.header("content-length") == "12345" and body == b""


async def test_bytes_after_the_response_spoil_the_connection() -> None:
    garbage = OK + b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad"
    async with Raw(answer_each(garbage, OK)) as srv, pool_for(srv.port) as pool:
        _, body, _ = await fetch(pool)
        assert body == b"hello"
        _, body, phase = await fetch(pool)
        assert body == b"hello" and phase.reused is False and srv.connections == 2


async def test_stale_pooled_connection_is_retried_only_for_idempotent_methods() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        if n == 0:
            await read_request(reader)  # the second request on the first connection: hang up
            return
        await reader.read()

    async with Raw(script) as srv, pool_for(srv.port) as pool:
        await fetch(pool, "GET", b"")
        _, body, phase = await fetch(pool, "GET", b"")
        assert body == b"hello" and phase.reused is False and srv.connections == 2
    async with Raw(script) as srv, pool_for(srv.port) as pool:
        await fetch(pool)
        with pytest.raises(UpstreamBroken, match="closed the connection before responding"):
            await fetch(pool)  # a POST may have been acted on: never sent twice
        assert srv.connections == 1


async def test_idle_read_timeout_before_and_after_the_head() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        await reader.read()

    async with Raw(silent) as srv, pool_for(srv.port, read_timeout=0.3) as pool:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(UpstreamTimeout):
            await fetch(pool)
        assert 0.25 < asyncio.get_running_loop().time() - t0 < 2.0

    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(4):  # keeps the stream alive past the timeout with reads 0.1 s apart
            writer.write(b"3\r\nabc\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
        await reader.read()

    async with Raw(stalls) as srv, pool_for(srv.port, read_timeout=0.3) as pool:
        with pytest.raises(BodyFailure) as info:
            await fetch(pool)
        assert info.value.error_type == "timeout"


async def test_connect_failures_are_our_own_errors() -> None:
    async with Raw(answer_each(OK)) as srv:
        port = srv.port
    async with pool_for(port) as pool:  # nothing listens there any more
        with pytest.raises(UpstreamUnreachable, match=f"cannot connect to upstream 127.0.0.1:{port}"):
            await fetch(pool)
    pool = UpstreamPool(URL("http://no-such-host.invalid"), connect_timeout=2, read_timeout=2, keepalive=1)
    with pytest.raises(UpstreamUnreachable, match="cannot resolve upstream host no-such-host.invalid"):
        await fetch(pool)
    await pool.close()


async def test_backpressure_pauses_reading_until_the_sink_drains() -> None:
    block = b"x" * 65536

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(block) * 64))
        for _ in range(64):
            writer.write(block)
            await writer.drain()
        await reader.read()

    async with Raw(script) as srv, pool_for(srv.port) as pool:
        resp = await pool.request("GET", "/big", [], b"", PhaseClock(0.0))
        got = 0
        pauses = 0

        def sink(chunk: bytes) -> bool:
            nonlocal got
            got += len(chunk)
            return True  # always "full": every read pauses the upstream

        async def drained() -> None:
            nonlocal pauses
            pauses += 1
            await asyncio.sleep(0)

        await asyncio.wait_for(resp.relay(sink, drained), 10)
        resp.close()
        assert got == len(block) * 64 and pauses >= 1


async def test_cancelling_a_request_closes_the_upstream_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        await writer.drain()
        await reader.read()  # returns when the proxy closes

    async with Raw(script) as srv, pool_for(srv.port) as pool:
        task = asyncio.ensure_future(fetch(pool))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if srv.closed:
                break
            await asyncio.sleep(0.01)
        assert srv.closed == [0]


async def test_connection_cap_makes_requests_wait_their_turn() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        while True:
            await read_request(reader)
            await asyncio.sleep(0.2)
            writer.write(OK)
            await writer.drain()

    async with Raw(slow) as srv, pool_for(srv.port, max_connections=1) as pool:
        results = await asyncio.gather(fetch(pool), fetch(pool))
        waits = sorted(phase.pool_wait or 0.0 for _, _, phase in results)
        assert [body for _, body, _ in results] == [b"hello", b"hello"]
        assert waits[0] < 0.1 and waits[1] > 0.1 and srv.connections == 1


async def test_a_second_close_neither_cuts_the_next_request_nor_frees_a_second_slot() -> None:
    """close() and discard_rest() after close() do nothing: the connection already went back to
    the pool (here: to the next request) and the cap's slot was already released."""

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        while True:
            await read_request(reader)
            await asyncio.sleep(0.2)
            writer.write(OK)
            await writer.drain()

    async with Raw(slow) as srv, pool_for(srv.port, max_connections=1) as pool:
        first, _, _ = await fetch(pool)  # closed once: its connection is pooled
        second = asyncio.ensure_future(fetch(pool))  # takes that connection
        await asyncio.sleep(0.05)  # its request is sent; the answer comes 0.2 s after it
        first.close()
        first.discard_rest()
        _, body, phase = await asyncio.wait_for(second, 5)  # (a cut one could wait forever: its timer went)
        assert body == b"hello" and phase.reused
        results = await asyncio.gather(fetch(pool), fetch(pool))
        waits = sorted(phase.pool_wait or 0.0 for _, _, phase in results)
        assert [body for _, body, _ in results] == [b"hello", b"hello"]
        assert waits[1] > 0.1 and srv.connections == 1  # still one slot: the second waited its turn


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_sink_failing_on_the_read_that_ends_the_body_does_not_stall_the_relay(chunked: bool) -> None:
    """The client leaves (the sink raises) on the very read that completes the response: the relay
    returns at once (the response is whole) and the connection, its reader gone mid-read, is not
    pooled; the request never waits for a timeout."""
    first, last = (b"5\r\nhel", b"lo\r\n0\r\n\r\n") if chunked else (b"hel", b"lo")
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: 5"

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\n" + framing + b"\r\n\r\n" + first)
            await writer.drain()
            await asyncio.sleep(0.1)  # the last bytes in a read of their own
            writer.write(last)
            await writer.drain()

    async with Raw(script) as srv, pool_for(srv.port, read_timeout=30.0) as pool:
        resp = await pool.request("POST", "/v1/x", [], b"{}", PhaseClock(0.0))
        got = bytearray()

        def sink(chunk: bytes) -> bool:
            if got:
                raise ConnectionResetError("the client left")  # what the relay's sink raises then
            got.extend(chunk)
            return False

        async def drained() -> None:
            return None

        try:
            await asyncio.wait_for(resp.relay(sink, drained), 5)  # 30 s read timeout: a stall fails here
        finally:
            resp.close()
        assert bytes(got) == b"hel" and resp.complete
        _, body, phase = await fetch(pool)
        assert body == b"hello" and not phase.reused and srv.connections == 2


async def test_https_upstream_is_verified_and_named(tmp_path: object) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)

    async def hello(_request: web.Request) -> web.Response:
        return web.Response(text="over tls")

    app = web.Application()
    app.router.add_get("/v1/x", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        trusted = ssl.create_default_context()
        ca.configure_trust(trusted)
        pool = UpstreamPool(
            URL(f"https://localhost:{port}"), connect_timeout=2, read_timeout=2, keepalive=1, ssl_context=trusted
        )
        resp, body, phase = await fetch(pool, "GET", b"")
        assert (resp.status, body, phase.reused) == (200, b"over tls", False)
        assert phase.connect is not None and phase.connect > 0
        await pool.close()
        untrusted = UpstreamPool(URL(f"https://localhost:{port}"), connect_timeout=2, read_timeout=2, keepalive=1)
        with pytest.raises(UpstreamUnreachable, match="TLS handshake with upstream localhost"):
            await fetch(untrusted, "GET", b"")
        await untrusted.close()
    finally:
        await runner.cleanup()


async def test_body_arriving_before_the_relay_attaches_is_bounded() -> None:
    total = 4 << 20

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        for _ in range(total // 65536):
            writer.write(b"y" * 65536)
            await writer.drain()
        await reader.read()

    async with Raw(script) as srv, pool_for(srv.port) as pool:
        resp = await pool.request("GET", "/big", [], b"", PhaseClock(0.0))
        await asyncio.sleep(0.3)  # a handler slow to attach: the upstream keeps sending meanwhile
        held = sum(len(c) for c in resp._conn.pending)
        assert held <= (256 + 256) * 1024
        got = 0

        def sink(chunk: bytes) -> bool:
            nonlocal got
            got += len(chunk)
            return False

        async def drained() -> None:
            return None

        await asyncio.wait_for(resp.relay(sink, drained), 10)
        resp.close()
        assert got == total


async def test_a_second_response_behind_the_last_body_bytes_ends_the_relay_and_the_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello")
        await writer.drain()
        await asyncio.sleep(0.2)  # the relay is waiting for more
        writer.write(b"world" + OK)  # the end, and a response nobody asked for, in one read
        await reader.read()

    async with Raw(script) as srv, pool_for(srv.port) as pool:
        resp, body, _ = await asyncio.wait_for(fetch(pool), 3)
        assert body == b"helloworld" and resp.complete
        await asyncio.sleep(0.05)
        assert srv.closed == [0]  # not pooled: the connection cannot be trusted
