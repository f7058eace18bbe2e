"""A minimal, fast, deterministic SSE upstream for the benchmark (not the simulator).

Raw asyncio protocol on uvloop: HTTP/1.1 keep-alive, chunked responses, no framework, so the
upstream costs little of the shared core and adds no jitter of its own. A streaming `POST` to a
path ending in `/chat/completions`, `/completions`, `/responses` or `/messages` streams that
dialect's `payload.stream_parts(api, model, max_tokens)` (chat: `payload.stream_events`):

    t_request         response head + the events before the first token (chat: the role-only
                      chunk; first byte, not first token)
    + ttft            token 0
    + i * interval    token i (absolute deadlines: a late tick never shifts later ones)
    after the last    the tail (chat: finish chunk, usage chunk, `data: [DONE]`)

Model `bench-hold` stops after token 0 and holds the stream open until `GET /bench/release`
(the idle-stream memory test). `GET /bench/stats` returns counters as JSON.

For a request that carries a `traceparent` (taotrace sends one upstream, with the trace id of its
own record), the instant token 0 was written is kept: `time.perf_counter()` (CLOCK_MONOTONIC on
Linux, the clock the proxy stamps its first token with) just before `transport.write`, which on
uvloop sends at once. Not after it: on the 2-vCPU VM the call took 9-11 us at p50 but ~110 us at
p90 and up to 0.3 ms (the send also wakes the reader), while the bytes were readable early in it:
a stamp after it made the client's own lag negative at 8 streams.
`GET /bench/first_tokens` returns them as `{trace_id: seconds}` and forgets them. The last
token's write is stamped the same way (before its own `transport.write`; the tail follows in
writes of its own): `GET /bench/last_tokens`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from dataclasses import dataclass, field
from functools import lru_cache

import orjson
from payload import api_for_path, run, stream_parts

HOLD_MODEL = "bench-hold"
SATURATE_MODEL = "bench-saturate"  # first token at 1 ms, then 1 ms apart: the proxy, not the pacing, limits
_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\n"
    b"x-request-id: req_bench\r\n"
    b"transfer-encoding: chunked\r\n"
    b"\r\n"
)


def _frame(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


@lru_cache(maxsize=64)
def framed_events(api: str, model: str, n_tokens: int) -> tuple[bytes, ...]:
    """The head's events as one HTTP/1.1 chunk frame each, joined (one write), then each token's
    and each tail event's frame."""
    head, tokens, tail = stream_parts(api, model, n_tokens)
    return (b"".join(map(_frame, head)), *map(_frame, tokens), *map(_frame, tail))


@dataclass
class Stats:
    """Counters served at /bench/stats."""

    requests: int = 0
    completed: int = 0
    aborted: int = 0
    active: int = 0
    held: set[Stream] = field(default_factory=set)
    first_writes: dict[str, float] = field(default_factory=dict)  # trace id -> token 0 written (perf_counter)
    last_writes: dict[str, float] = field(default_factory=dict)  # trace id -> the last token written


class Stream:
    """One paced response; owns its timer."""

    __slots__ = ("conn", "frames", "n", "i", "t0", "ttft", "interval", "timer", "hold", "stats", "trace_id")

    def __init__(
        self,
        conn: Conn,
        api: str,
        model: str,
        n_tokens: int,
        ttft: float,
        interval: float,
        stats: Stats,
        trace_id: str,
    ) -> None:
        self.conn = conn
        self.trace_id = trace_id  # "" when the request carried no traceparent
        self.frames = framed_events(api, model, n_tokens)
        self.n = n_tokens
        self.i = 0  # next token index
        self.ttft = ttft
        self.interval = interval
        self.hold = model == HOLD_MODEL
        self.stats = stats
        self.timer: asyncio.TimerHandle | None = None
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()
        conn.transport.write(_HEAD + self.frames[0])
        self.timer = loop.call_at(self.t0 + ttft, self.tick)

    def tick(self) -> None:
        self.timer = None
        conn = self.conn
        if conn.transport.is_closing():
            return
        if self.i < self.n:
            if self.trace_id:
                if self.i == 0:
                    self.stats.first_writes[self.trace_id] = time.perf_counter()  # see the module docstring
                if self.i == self.n - 1:
                    self.stats.last_writes[self.trace_id] = time.perf_counter()
            conn.transport.write(self.frames[1 + self.i])
            self.i += 1
        if self.i >= self.n:
            for frame in self.frames[1 + self.n :]:
                conn.transport.write(frame)
            conn.transport.write(b"0\r\n\r\n")
            self.stats.completed += 1
            self.stats.active -= 1
            conn.stream = None
            conn.response_done()
            return
        if self.hold and self.i == 1:
            self.stats.held.add(self)
            return
        loop = asyncio.get_running_loop()
        self.timer = loop.call_at(self.t0 + self.ttft + self.i * self.interval, self.tick)

    def release(self) -> None:
        """Resume a held stream: the remaining tokens follow at the usual interval from now."""
        loop = asyncio.get_running_loop()
        self.t0 = loop.time() - self.ttft - (self.i - 1) * self.interval
        self.tick()

    def abort(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.stats.held.discard(self)
        self.stats.active -= 1
        self.stats.aborted += 1


class Conn(asyncio.Protocol):
    """One client connection: parses requests (Content-Length or chunked bodies), keep-alive."""

    def __init__(self, ttft: float, interval: float, stats: Stats) -> None:
        self.ttft = ttft
        self.interval = interval
        self.stats = stats
        self.buf = bytearray()
        self.stream: Stream | None = None
        self.close_after = False
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.abort()
            self.stream = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.stream is None:
            self._parse()

    def response_done(self) -> None:
        if self.close_after:
            self.transport.close()
        elif self.buf:
            self._parse()

    def _parse(self) -> None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        method, target, _ = head[0].split(" ", 2)
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        pos = end + 4
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                eol = self.buf.find(b"\r\n", pos)
                if eol < 0:
                    return
                size = int(bytes(self.buf[pos:eol]).split(b";")[0], 16)
                if len(self.buf) < eol + 2 + size + 2:
                    return
                body += self.buf[eol + 2 : eol + 2 + size]
                pos = eol + 2 + size + 2
                if size == 0:
                    break
        else:
            length = int(headers.get("content-length", "0"))
            if len(self.buf) < pos + length:
                return
            body = self.buf[pos : pos + length]
            pos += length
        del self.buf[:pos]
        self.close_after = headers.get("connection", "").lower() == "close"
        self._handle(method, target, bytes(body), headers.get("traceparent", ""))

    def _reply(self, status: str, body: bytes, ctype: str = "application/json") -> None:
        self.transport.write(
            b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (status.encode(), ctype.encode(), len(body), body)
        )
        self.response_done()

    def _handle(self, method: str, target: str, body: bytes, traceparent: str = "") -> None:
        path = target.split("?", 1)[0]
        api = api_for_path(path) if method == "POST" else None
        if api is not None:
            req = orjson.loads(body) if body else {}
            model = str(req.get("model", "bench-model"))
            n = int(req.get("max_tokens") or req.get("max_completion_tokens") or req.get("max_output_tokens") or 16)
            self.stats.requests += 1
            if not req.get("stream"):  # the same (chat) body whatever the dialect: only streams are timed
                self._reply("200 OK", _non_stream(model, n))
                return
            self.stats.active += 1
            fast = model == SATURATE_MODEL
            self.stream = Stream(
                self,
                api,
                model,
                n,
                0.001 if fast else self.ttft,
                0.001 if fast else self.interval,
                self.stats,
                traceparent[3:35],  # 00-<trace id>-<parent id>-<flags>
            )
        elif path == "/bench/release":
            held = list(self.stats.held)
            self.stats.held.clear()
            for s in held:
                s.release()
            self._reply("200 OK", orjson.dumps({"released": len(held)}))
        elif path == "/bench/first_tokens":
            writes, self.stats.first_writes = self.stats.first_writes, {}
            self._reply("200 OK", orjson.dumps(writes))
        elif path == "/bench/last_tokens":
            writes, self.stats.last_writes = self.stats.last_writes, {}
            self._reply("200 OK", orjson.dumps(writes))
        elif path == "/bench/stats":
            s = self.stats
            self._reply(
                "200 OK",
                orjson.dumps(
                    {
                        "requests": s.requests,
                        "completed": s.completed,
                        "aborted": s.aborted,
                        "active": s.active,
                        "held": len(s.held),
                    }
                ),
            )
        elif path.endswith("/models"):
            self._reply("200 OK", orjson.dumps({"object": "list", "data": [{"id": "bench-model", "object": "model"}]}))
        else:
            self._reply("404 Not Found", b'{"error":{"message":"not found"}}')


def _non_stream(model: str, n: int) -> bytes:
    text = "".join(f" tok{i}" for i in range(n))
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": n, "total_tokens": 12 + n},
        }
    )


async def serve(host: str, port: int, ttft: float, interval: float) -> None:
    loop = asyncio.get_running_loop()
    stats = Stats()
    server = await loop.create_server(lambda: Conn(ttft, interval, stats), host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"bench upstream on http://{host}:{port} ttft={ttft * 1e3:g}ms interval={interval * 1e3:g}ms pid={os.getpid()}",
        flush=True,
    )
    async with server:
        await stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    args = ap.parse_args()
    run(serve(args.host, args.port, args.ttft_ms / 1e3, args.interval_ms / 1e3))


if __name__ == "__main__":
    main()
