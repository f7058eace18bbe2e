"""The upstream client's own work per request, without sockets: instructions (or µs) A/B.

    python tests/bench/upstream_micro.py --src /tmp/base --src .               # µs, best of runs, interleaved
    python tests/bench/upstream_micro.py --src /tmp/base --src . --callgrind   # instructions per request

Each request goes through `UpstreamPool.request`, `UpstreamResponse.relay` and `close` on a pooled
connection whose transport is a script: writing the request schedules the reads a 16-token chat
stream through the bench upstream gives (the head, 16 chunked events, the last chunk), one per
event-loop turn. Nothing waits on the kernel or the clock, so the work is the same every run:
under `--callgrind` the instructions of N requests minus those of N/4 are exact, deaf to other
processes. An arm is a directory holding a `proxy/` package.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Date: Thu, 03 Dec 2026 10:00:00 GMT\r\nServer: bench\r\nX-Request-Id: 0123456789abcdef\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
EVENT = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
READS = [HEAD] + [b"%x\r\n%s\r\n" % (len(EVENT), EVENT)] * 16 + [b"0\r\n\r\n"]


class ScriptedTransport(asyncio.Transport):
    """Answers each request written to it with `READS`, one read per loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: Any) -> None:
        super().__init__()
        self.loop = loop
        self.protocol = protocol
        self.at = 0

    def write(self, data: Any) -> None:
        self.at = 0
        self.loop.call_soon(self._next)

    def writelines(self, parts: Any) -> None:
        self.write(b"")

    def _next(self) -> None:
        self.protocol.data_received(READS[self.at])
        self.at += 1
        if self.at < len(READS):
            self.loop.call_soon(self._next)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        raise RuntimeError("the bench connection was dropped")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def run(n: int) -> float:
    from yarl import URL

    from proxy.exchange.timing import PhaseClock
    from proxy.upstream import UpstreamPool

    pool = UpstreamPool(URL("http://127.0.0.1:9"), connect_timeout=1, read_timeout=60, keepalive=60)
    dial = pool._new_connection if hasattr(pool, "_new_connection") else None  # this tree or the one before
    if dial is not None:
        conn = dial()
    else:
        from proxy.upstream import _Connection  # type: ignore[attr-defined]

        conn = _Connection(pool)
    loop = asyncio.get_running_loop()
    conn.connection_made(ScriptedTransport(loop, conn))
    pool._free.append(conn)
    headers = [("Content-Type", "application/json"), ("Authorization", "Bearer sk-bench")]

    def sink(chunk: bytes) -> bool:
        return False

    async def drained() -> None:
        return None

    t0 = time.perf_counter()
    for _ in range(n):
        resp = await pool.request("POST", "/v1/chat/completions", headers, b"{}", PhaseClock(0.0))
        await resp.relay(sink, drained)
        assert resp.complete
        resp.close()
    return (time.perf_counter() - t0) / n * 1e6


def _child(n: int) -> None:
    import uvloop

    print(f"{uvloop.run(run(n)):.3f}")


def _callgrind(src: Path, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
             "--child", str(n)],
            cwd=src, env={**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}, capture_output=True, check=True,
        )  # fmt: skip
        m = re.search(r"^(?:summary|totals): (\d+)", out.read_text(errors="replace"), re.M)
        assert m is not None
        return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", action="append", type=Path, help="a directory holding proxy/ (repeat for A/B)")
    ap.add_argument("--number", type=int, default=2000, help="requests per run")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--callgrind", action="store_true", help="count instructions instead (valgrind)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        _child(args.child)
        return
    srcs = [s.resolve() for s in args.src or [Path(".")]]
    if args.callgrind:
        for src in srcs:
            many, few = _callgrind(src, args.number), _callgrind(src, args.number // 4)
            print(f"{src}: {(many - few) / (args.number - args.number // 4):.0f} instructions/request")
        return
    runs: dict[Path, list[float]] = {src: [] for src in srcs}
    for _ in range(args.rounds):  # interleaved: a noisy neighbour hits every tree alike
        for src in srcs:
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(args.number)], cwd=src,
                env={**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            runs[src].append(float(out))
    for src, values in runs.items():
        print(f"{src}: best {min(values):.2f} us/request ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
