"""CPU of a request's critical path through the proxy, in-process, per segment, A/B between trees.

    python tests/bench/critical_path.py                                   # this checkout
    python tests/bench/critical_path.py --src /tmp/base --src .           # A/B: trees holding proxy/, interleaved
    python tests/bench/critical_path.py --src /tmp/base --src . --callgrind   # instructions per segment

One process runs the whole proxy (`proxy.serve.running`, spans handed to a processor that keeps
nothing, on the loop), a fake upstream and a client, each on a loopback port, on one uvloop
loop, and sends one request at a time (a 16-token chat stream, the bench upstream's shape: the
head and the first event in one write, the other events and the end in a second one). Each
request's CPU (`time.thread_time_ns`: user + system time of the one thread that runs all three)
is split at three instants:

- `request`: the client's write of its request -> the upstream has read it whole (the proxy's
  aiohttp server side, the handler up to the upstream write, the loop between);
- `first chunk`: the upstream's write of the head + first event -> the client has read them
  (the response head parsed, `prepare`, `_Relay.start`);
- `rest`: the rest of the stream and the request's bookkeeping, until the client has the end.

The client's and the upstream's own work is in each segment, the same in every tree. Reported:
the median over `--number` requests of each segment, the best of `--rounds` fresh processes per
tree, interleaved (ABBA). `--callgrind` counts each segment's instructions instead (valgrind, collecting
only inside the segment, toggled by a two-line C library built on the spot with `cc`; mean over
N requests after the warm-up): deaf to other processes, the same from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from procs import best_of_runs

BODY = (
    b'{"model":"bench-model","messages":[{"role":"system","content":"You are terse."},'
    b'{"role":"user","content":"Say hello in sixteen tokens."}],"stream":true,'
    b'"stream_options":{"include_usage":true},"max_tokens":64,"temperature":0.7}'
)
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip, deflate\r\n"
    b"Connection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\n"
    b"User-Agent: OpenAI/Python 1.99.0\r\nX-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.99.0\r\n"
    b"Authorization: Bearer sk-" + b"x" * 48 + b"\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(delta: str) -> bytes:
    return (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"bench-model",'
        b'"choices":[{"index":0,"delta":' + delta.encode() + b',"finish_reason":null}]}\n\n'
    )


HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Date: Thu, 03 Dec 2026 12:00:00 GMT\r\nServer: bench\r\nX-Request-Id: req_0123456789abcdef\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
FIRST = HEAD + _chunk(_event('{"role":"assistant","content":""}'))
REST = (
    b"".join(_chunk(_event('{"content":"tok"}')) for _ in range(16))
    + _chunk(
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"bench-model",'
        b'"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":16,"total_tokens":28}}\n\n'
    )
    + _chunk(b"data: [DONE]\n\n")
    + b"0\r\n\r\n"
)
CPU = time.thread_time_ns


class Marks:
    """The instants of the request in flight (thread CPU ns); `toggle`, when counting instructions
    of one segment, is called at its start and at its end."""

    def __init__(self) -> None:
        self.sent = self.upstream_read = self.upstream_wrote = self.first_read = 0
        self.toggle: Callable[[], None] | None = None
        self.edges: tuple[str, str] = ("", "")
        self.done: asyncio.Future[None] | None = None
        self.rest: Any = None  # the upstream's write of the rest, once the client has the first bytes


def _edge(marks: Marks, name: str) -> None:
    if marks.toggle is not None and name in marks.edges:
        marks.toggle()


class Upstream(asyncio.Protocol):
    """Reads a request whole, answers with `FIRST` at once; the client has it write `REST`."""

    def __init__(self, marks: Marks) -> None:
        self.marks = marks
        self.buf = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head, sep, body = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        if len(body) < length:
            return
        self.buf = body[length:]
        marks = self.marks
        marks.upstream_read = CPU()
        _edge(marks, "upstream_read")
        marks.rest = self.transport
        _edge(marks, "upstream_wrote")
        marks.upstream_wrote = CPU()
        self.transport.write(FIRST)


class Client(asyncio.Protocol):
    def __init__(self, marks: Marks) -> None:
        self.marks = marks
        self.got = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def send(self) -> None:
        self.got = 0
        _edge(self.marks, "sent")
        self.marks.sent = CPU()
        self.transport.write(REQUEST)

    def data_received(self, data: bytes) -> None:
        marks = self.marks
        if self.got == 0:
            marks.first_read = CPU()
            _edge(marks, "first_read")
            marks.rest.write(REST)  # a decode gap: the rest comes after the first chunk was relayed
        self.got += len(data)
        if data.endswith(b"0\r\n\r\n") and marks.done is not None and not marks.done.done():
            marks.done.set_result(None)


class Discard:
    """A span processor that keeps nothing (the spans are built, as when exported)."""

    def on_end(self, span: Any) -> None:
        pass

    def force_flush(self, timeout: float) -> bool:
        return True

    def shutdown(self, timeout: float) -> bool:
        return True


EDGES = {
    "request": ("sent", "upstream_read"),
    "first chunk": ("upstream_wrote", "first_read"),
    "rest": ("first_read", "end"),
}


def _toggler(tmp: str) -> Callable[[], None]:
    """CALLGRIND_TOGGLE_COLLECT, callable from Python: a two-line C library built here."""
    import ctypes

    c, lib = Path(tmp) / "toggle.c", Path(tmp) / "toggle.so"
    c.write_text("#include <valgrind/callgrind.h>\nvoid toggle(void) { CALLGRIND_TOGGLE_COLLECT; }\n")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(c)], check=True)
    fn: Callable[[], None] = ctypes.CDLL(str(lib)).toggle
    return fn


async def run(n: int, segment: str | None = None) -> dict[str, list[int]]:
    from yarl import URL

    from proxy.config.settings import Settings
    from proxy.serve import running
    from proxy.telemetry.tracing import Tracing

    loop = asyncio.get_running_loop()
    marks = Marks()
    server = await loop.create_server(lambda: Upstream(marks), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = Settings(upstream=f"http://127.0.0.1:{port}", port=0, metrics_port=0, log_level="warning")
    segments: dict[str, list[int]] = {"request": [], "first chunk": [], "rest": []}
    async with running(settings, tracing=Tracing(processor=Discard())) as proxy:
        url = URL(proxy.proxy_url)
        _, client = await loop.create_connection(lambda: Client(marks), url.host, url.port)
        toggle = _toggler(tempfile.mkdtemp()) if segment else None
        for i in range(n + 50):  # the first 50 warm up
            if i == 50 and segment:
                marks.toggle, marks.edges = toggle, EDGES[segment]
            marks.done = loop.create_future()
            client.send()
            await marks.done
            _edge(marks, "end")
            end = CPU()
            if i >= 50:
                segments["request"].append(marks.upstream_read - marks.sent)
                segments["first chunk"].append(marks.first_read - marks.upstream_wrote)
                segments["rest"].append(end - marks.first_read)
        marks.toggle = None
        client.transport.close()
    server.close()
    return segments


def _child(src: Path, n: int, segment: str | None) -> None:
    sys.path.insert(0, str(src))
    import uvloop

    segments = uvloop.run(run(n, segment))
    print(json.dumps({name: statistics.median(values) / 1e3 for name, values in segments.items()}))


def _env(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAOTRACE_", "OTEL_"))}
    return {**env, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}


def _callgrind(src: Path, n: int, segment: str) -> float:
    """Instructions per request of `segment` (collected only inside it, after the warm-up)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={out}", sys.executable,
             __file__, "--child", "--src", str(src), "--number", str(n), "--segment", segment],
            cwd=src, env=_env(src), capture_output=True, check=True,
        )  # fmt: skip
        m = re.search(r"^(?:summary|totals): (\d+)", out.read_text(errors="replace"), re.M)
        assert m is not None
        return int(m.group(1)) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--src", action="append", type=Path, help="a tree holding proxy/ (repeat for A/B; default: this one)"
    )
    ap.add_argument("--number", type=int, default=2000, help="requests per run")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per tree, interleaved; the best is kept")
    ap.add_argument("--callgrind", action="store_true", help="instructions per segment instead (valgrind)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--segment", choices=sorted(EDGES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    srcs = [s.resolve() for s in args.src or [Path(__file__).resolve().parents[2]]]
    if args.child:
        _child(srcs[0], args.number, args.segment)
        return
    if args.callgrind:
        counts = {src: {segment: _callgrind(src, args.number, segment) for segment in EDGES} for src in srcs}
        print(f"{'instructions per request':40s}" + "".join(f"{str(src)[-18:]:>20s}" for src in srcs))
        for segment in EDGES:
            print(f"{segment:40s}" + "".join(f"{counts[src][segment]:20,.0f}" for src in srcs))
        return

    def run(src: Path) -> dict[str, float]:
        argv = [sys.executable, __file__, "--child", "--src", str(src), "--number", str(args.number)]
        out = subprocess.run(argv, cwd=src, env=_env(src), capture_output=True, text=True, check=True).stdout
        return dict(json.loads(out))

    best = best_of_runs(srcs, run, args.rounds)
    print(f"{'us CPU per request (median, best run)':40s}" + "".join(f"{str(src)[-18:]:>20s}" for src in srcs))
    for name in best[srcs[0]]:
        print(f"{name:40s}" + "".join(f"{best[src][name]:20.1f}" for src in srcs))


if __name__ == "__main__":
    main()
