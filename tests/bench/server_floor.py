"""What serving a stream costs before any proxying: the bench upstream against aiohttp's server.

    python tests/bench/server_floor.py                      # both servers, 16 and 64 tokens, 3 rounds
    python tests/bench/server_floor.py --serve --port 9400  # just the aiohttp server (for a look)

Two servers stream the same chat completions (`payload.stream_events`: the role chunk with the
head, then a token every `--interval-ms` after `--ttft-ms`, then the tail) to `load.py`'s
clients: `upstream.py`, raw asyncio on uvloop that writes each token from a timer, and an
aiohttp low-level server (`web.Server`, no router) on uvloop that does the least an aiohttp
handler can: read the body, `prepare` a `StreamResponse`, `write` each event, `write_eof`.
Neither times, parses a response or records anything. CPU per stream is read from schedstat
around the load, at two lengths; the fit `fixed + per_event * tokens` through them says what one
request costs whatever its length, and what each further event costs.

A reverse proxy does the work of both halves, a server to its client and a client to its
upstream, so its fixed cost cannot fall below the server's here plus what the upstream side
adds; the comparison with `taotrace`'s own fit (`run.py`, `cpu_per_request.py`) is in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from payload import run, stream_events
from procs import Proc, cpu_ns, free_port, load_streams, wait_port

HERE = Path(__file__).resolve().parent
PY = sys.executable


async def serve(port: int, ttft: float, interval: float) -> None:
    """The aiohttp server: the bench upstream's chat stream, written through aiohttp's own response."""
    from aiohttp import web

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        events = stream_events(str(body.get("model", "m")), int(body.get("max_tokens", 16)))
        n = len(events) - 4  # the role chunk, then the tokens, then finish, usage and [DONE]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await resp.write(events[0])
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i in range(n):
            await asyncio.sleep(max(0.0, t0 + ttft + i * interval - loop.time()))
            await resp.write(events[1 + i])
        for event in events[1 + n :]:
            await resp.write(event)
        await resp.write_eof()
        return resp

    server = web.Server(handler)
    loop = asyncio.get_running_loop()
    await loop.create_server(server, "127.0.0.1", port, reuse_address=True)
    await asyncio.Event().wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", action="store_true", help="only run the aiohttp server, on --port")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--interval-ms", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--lengths", default="16,64", help="two stream lengths, in tokens, for the fit")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--logs", type=Path, default=Path("/tmp/server_floor"))
    args = ap.parse_args()
    if args.serve:
        run(serve(args.port, args.ttft_ms / 1e3, args.interval_ms / 1e3))
        return
    short, long = (int(n) for n in args.lengths.split(","))
    args.logs.mkdir(parents=True, exist_ok=True)
    timing = ["--ttft-ms", str(args.ttft_ms), "--interval-ms", str(args.interval_ms)]
    servers = {
        "upstream.py (raw asyncio)": [PY, str(HERE / "upstream.py"), *timing],
        "aiohttp web.Server": [PY, __file__, "--serve", *timing],
    }
    cpu: dict[tuple[str, int], list[float]] = {}
    for name, argv in servers.items():
        port = free_port()
        proc = Proc(name, [*argv, "--port", str(port)], args.logs / f"{port}.log").start()
        try:
            wait_port(port, 30, proc.popen)
            load_streams(port, args.concurrency, short, 2.0)  # warm-up
            for _ in range(args.rounds):
                for tokens in (short, long):
                    pids = proc.pids(refresh=True)
                    before = cpu_ns(pids)
                    streams = load_streams(port, args.concurrency, tokens, args.seconds)
                    cpu.setdefault((name, tokens), []).append((cpu_ns(pids) - before) / streams / 1e3)
                    time.sleep(0.5)
        finally:
            proc.popen.terminate()  # type: ignore[union-attr]
            proc.popen.wait(30)  # type: ignore[union-attr]
    print(f"{args.concurrency} streams at a time, {args.rounds} rounds; µs of server CPU per stream (median)")
    for name in servers:
        a, b = (statistics.median(cpu[name, n]) for n in (short, long))
        per_event = (b - a) / (long - short)
        print(
            f"{name}: {short} tokens {a:.0f}, {long} tokens {b:.0f}; "
            f"fit {a - per_event * short:.0f} µs + {per_event:.1f} µs per event"
        )


if __name__ == "__main__":
    main()
