"""Steady load against one address, for profiling a proxy (py-spy, pyinstrument) outside run.py.

    python tests/bench/upstream.py --port 9100 &
    python -m proxy serve --upstream http://127.0.0.1:9100 --port 9101 --metrics-port 9102 &
    python tests/bench/load.py --port 9101 --concurrency 32 --tokens 256 --seconds 20
    py-spy record -p <proxy pid> -d 15 -o profile.svg   # while it runs

Repeats batches of C streams started together until the time is up; prints TTFT and errors.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from client import MODEL, Pool, analyse, request_bytes
from payload import run


async def load(port: int, conc: int, tokens: int, seconds: float) -> None:
    pool = Pool("127.0.0.1", port)
    raw = request_bytes("127.0.0.1", port, "/v1/chat/completions", MODEL, tokens)
    ttfts: list[int] = []
    errors = streams = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conns, _ = await pool.acquire(conc)
        results = await asyncio.gather(*(c.send(raw) for c in conns))
        pool.release(conns)
        for r in results:
            s = analyse(r, MODEL, tokens)
            streams += 1
            if s.ok:
                ttfts.append(s.ttft)
            else:
                errors += 1
    pool.close()
    ttfts.sort()
    if ttfts:
        p50 = ttfts[len(ttfts) // 2] / 1e6
        p99 = ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] / 1e6
        print(f"{streams} streams, {errors} errors, TTFT p50 {p50:.2f} ms p99 {p99:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    run(load(args.port, args.concurrency, args.tokens, args.seconds))


if __name__ == "__main__":
    main()
