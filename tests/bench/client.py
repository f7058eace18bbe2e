"""The measuring client: raw asyncio HTTP/1.1 over keep-alive connections, timestamps on arrival.

No HTTP library sits between the socket and the clock: `data_received` stamps
`perf_counter_ns()` first, de-chunks, and records one arrival time per completed SSE event
(`\\n\\n`). Events that arrive coalesced in one read share a timestamp, so buffering shows up
as a zero gap followed by a long one. Parsing the JSON (to find the first token) happens only
after the stream ends, off the measured path, and only when the body is not byte-exact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from payload import expected_body, expected_text

MODEL = "bench-model"
HOLD_MODEL = "bench-hold"
SATURATE_MODEL = "bench-saturate"  # the bench upstream paces it at 1 ms per token


def request_bytes(host: str, port: int, path: str, model: str, n_tokens: int, traceparent: str = "") -> bytes:
    """One streaming chat request; with `traceparent`, that header too (the upstream then keys its
    first-token write by the trace id)."""
    body = orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Count for me."}],
            "stream": True,
            "max_tokens": n_tokens,
            "stream_options": {"include_usage": True},
        }
    )
    return (
        b"POST %s HTTP/1.1\r\nHost: %s:%d\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer sk-bench-7f3a9c2e4b1d8f6a0e5c3b7d9a1f2e4c\r\naccept: text/event-stream\r\n"
        b"user-agent: taotrace-bench\r\n%scontent-length: %d\r\n\r\n%s"
        % (
            path.encode(),
            host.encode(),
            port,
            b"traceparent: %s\r\n" % traceparent.encode() if traceparent else b"",
            len(body),
            body,
        )
    )


@dataclass
class Response:
    """What one streamed request produced, with raw nanosecond timestamps."""

    t_send: int
    status: int = 0
    t_head: int = 0
    event_times: list[int] = field(default_factory=list)
    body: bytes = b""
    error: str | None = None


class Conn(asyncio.Protocol):
    """One keep-alive client connection; one request in flight at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.last_used = time.monotonic()
        self._reset()

    def _reset(self) -> None:
        self.resp: Response | None = None
        self.fut: asyncio.Future[Response] | None = None
        self.buf = bytearray()
        self.body = bytearray()
        self.head_done = False
        self.chunked = False
        self.length = -1
        self.chunk_left = 0  # bytes of chunk data still to read (+2 for its CRLF)
        self.keep_alive = True
        self.prev_nl = False
        self.on_first: Callable[[], None] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.fut is not None and not self.fut.done():
            if self.head_done and not self.chunked and self.length < 0:
                self._finish()  # body delimited by close
            else:
                assert self.resp is not None
                self.resp.error = f"connection lost: {exc!r}" if exc else "connection closed mid-response"
                self.resp.body = bytes(self.body)
                self.fut.set_result(self.resp)

    def send(self, raw: bytes, on_first: Callable[[], None] | None = None) -> asyncio.Future[Response]:
        """Write one request now; the returned future resolves when the response ends."""
        assert self.transport is not None and self.fut is None
        self.fut = asyncio.get_running_loop().create_future()
        self.on_first = on_first
        self.resp = Response(t_send=time.perf_counter_ns())
        self.transport.write(raw)
        return self.fut

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        resp = self.resp
        if resp is None:
            return
        self.buf += data
        if not self.head_done:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            resp.status = int(lines[0].split(" ", 2)[1])
            resp.t_head = now
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                value = value.strip().lower()
                if name == "transfer-encoding" and "chunked" in value:
                    self.chunked = True
                elif name == "content-length":
                    self.length = int(value)
                elif name == "connection" and value == "close":
                    self.keep_alive = False
            del self.buf[: end + 4]
            self.head_done = True
        if self.chunked:
            self._dechunk(now)
        else:
            self._take(bytes(self.buf), now)
            self.buf.clear()
            if 0 <= self.length <= len(self.body):
                self._finish()

    def _dechunk(self, now: int) -> None:
        buf = self.buf
        pos = 0
        while True:
            if self.chunk_left > 0:
                take = min(self.chunk_left, len(buf) - pos)
                if take <= 0:
                    break
                data_len = min(take, self.chunk_left - 2)  # the CRLF after chunk data is not body
                if data_len > 0:
                    self._take(bytes(buf[pos : pos + data_len]), now)
                pos += take
                self.chunk_left -= take
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
            if size == 0:
                if len(buf) < eol + 4:  # the final CRLF (no trailers from our servers)
                    break
                del buf[: eol + 4]
                self._finish()
                return
            pos = eol + 2
            self.chunk_left = size + 2
        del buf[:pos]

    def _take(self, data: bytes, now: int) -> None:
        if not data:
            return
        n = data.count(b"\n\n") + (1 if self.prev_nl and data[0] == 10 else 0)
        self.prev_nl = data[-1] == 10
        self.body += data
        if n:
            self.resp.event_times.extend([now] * n)  # type: ignore[union-attr]
            if self.on_first is not None and b"tok0" in self.body:
                cb, self.on_first = self.on_first, None
                cb()

    def _finish(self) -> None:
        resp, fut = self.resp, self.fut
        assert resp is not None and fut is not None
        resp.body = bytes(self.body)
        keep = self.keep_alive
        self._reset()
        self.last_used = time.monotonic()
        if not keep and self.transport is not None:
            self.transport.close()
            self.closed = True
        if not fut.done():
            fut.set_result(resp)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.closed = True


class Pool:
    """Idle keep-alive connections to one address (closed before any server's idle timeout)."""

    def __init__(self, host: str, port: int, max_idle: float = 2.0) -> None:
        self.host = host
        self.port = port
        self.max_idle = max_idle
        self.idle: list[Conn] = []

    async def acquire(self, n: int) -> tuple[list[Conn], int]:
        """n ready connections, and how many of them are new."""
        now = time.monotonic()
        fresh: list[Conn] = []
        for c in self.idle:
            if c.closed:
                continue
            if now - c.last_used > self.max_idle:
                c.close()
            else:
                fresh.append(c)
        self.idle = []
        got = fresh[:n]
        self.idle = fresh[n:]
        missing = n - len(got)
        loop = asyncio.get_running_loop()
        new: list[Conn] = []
        for start in range(0, missing, 200):  # bounded bursts: 1,000 SYNs at once overflow backlogs
            batch = await asyncio.gather(
                *(loop.create_connection(Conn, self.host, self.port) for _ in range(min(200, missing - start)))
            )
            new.extend(proto for _, proto in batch)
        return got + new, len(new)

    def release(self, conns: list[Conn]) -> None:
        for c in conns:
            if c.closed or c.fut is not None:
                c.close()
            else:
                self.idle.append(c)

    def close(self) -> None:
        for c in self.idle:
            c.close()
        self.idle = []


@dataclass
class StreamStats:
    """One stream, reduced: what the report needs (times in ns)."""

    ok: bool
    exact: bool
    ttft: int  # first token event - request written; -1 if none
    ttfb: int
    gaps: list[int]  # between consecutive token events
    events: int
    error: str | None


def analyse(resp: Response, model: str, n_tokens: int) -> StreamStats:
    """Reduce a response: byte-exact check, TTFT, inter-token gaps."""
    ttfb = resp.t_head - resp.t_send if resp.t_head else -1
    if resp.error or resp.status != 200:
        return StreamStats(False, False, -1, ttfb, [], len(resp.event_times), resp.error or f"HTTP {resp.status}")
    times = resp.event_times
    if resp.body == expected_body(model, n_tokens):
        # Byte-exact: token events are events 1..n (0 is the role chunk) - no parsing needed.
        if len(times) < n_tokens + 1:
            return StreamStats(False, True, -1, ttfb, [], len(times), "event count mismatch")
        tok_times = times[1 : n_tokens + 1]
        exact, ok, err = True, True, None
    else:
        events = resp.body.split(b"\n\n")
        tok_times, text, done = [], [], False
        for i, ev in enumerate(events[: len(times)]):
            for line in ev.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    continue
                try:
                    obj = orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue
                for choice in obj.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        text.append(content)
                        tok_times.append(times[i])
        exact = False
        ok = done and "".join(text) == expected_text(n_tokens)
        err = None if ok else "content mismatch" if done else "no [DONE]"
    if not tok_times:
        return StreamStats(False, exact, -1, ttfb, [], len(times), err or "no token")
    gaps = [b - a for a, b in zip(tok_times, tok_times[1:], strict=False)]
    return StreamStats(ok, exact, tok_times[0] - resp.t_send, ttfb, gaps, len(times), err)
