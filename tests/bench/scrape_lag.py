"""Event-loop lag of the serving processes while /metrics is scraped, at the 100-model cap.

    .venv/bin/python tests/bench/scrape_lag.py --workers 1 --seconds 20
    .venv/bin/python tests/bench/scrape_lag.py --workers 2 --seconds 20

Starts `taotrace serve` (or its supervisor and workers) in a child process with a probe in every
serving loop (how late a 5 ms sleep wakes up: the delay any stream's next chunk would see),
fills the model label to the cap with streams of every api (101 names each), then runs `--streams`
streams back to back (32 by default; 20 tokens 5 ms apart) while /metrics is scraped every
second (`--interval`) with Prometheus's Accept header (OpenMetrics). Spans go to a live OTLP/HTTP receiver in
this process (`--no-export`: none). Prints lag p50/p99/max per serving process, scrape times and
page size, and the streams' TTFT.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.fakes import FakeUpstream, OTLPSink, chat_stream, named, sse  # noqa: E402

TICK = 0.005
NL = b"\n"
PROMETHEUS_ACCEPT = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
APIS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}


def frames_for(path: str, tokens: int) -> list[bytes]:
    """A stream in the path's own dialect, so every api's histograms get observations."""
    if path.endswith("/chat/completions"):
        return chat_stream(tokens)
    if path.endswith("/completions"):
        chunks = [{"choices": [{"index": 0, "text": "tok"}]} for _ in range(tokens)]
        return sse(*chunks, {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens}})
    if path.endswith("/responses"):
        out = [named("response.created", {"type": "response.created"})]
        out += [named("response.output_text.delta", {"type": "response.output_text.delta", "delta": "tok"})] * tokens
        usage = {"input_tokens": 5, "output_tokens": tokens}
        return [*out, named("response.completed", {"type": "response.completed", "response": {"usage": usage}})]
    if path.endswith("/messages"):
        out = [named("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 5}}})]
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "tok"}}
        out += [named("content_block_delta", delta)] * tokens
        out.append(named("message_delta", {"type": "message_delta", "usage": {"output_tokens": tokens}}))
        return [*out, named("message_stop", {"type": "message_stop"})]
    return chat_stream(tokens)


def upstream_handler(tokens: int, gap: float):  # type: ignore[no-untyped-def]
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame in frames_for(request.path, tokens):
            await asyncio.sleep(gap)
            await resp.write(frame)
        await resp.write_eof()
        return resp

    return handler


# ---- inside the serving processes ------------------------------------------------------------


async def _sample(lags: list[tuple[float, float]]) -> None:
    while True:  # perf_counter: uvloop's loop.time() has millisecond steps
        t = time.perf_counter()
        await asyncio.sleep(TICK)
        lags.append((time.time(), time.perf_counter() - t - TICK))


def _report(lags: list[tuple[float, float]], name: str) -> None:
    out = Path(os.environ["LAG_DIR"]) / f"{name}-{os.getpid()}.json"
    out.write_text(json.dumps(lags))


def probed_worker(fd: str) -> None:
    """A worker of the group with the lag probe in its loop."""
    from proxy.workers import worker

    lags: list[tuple[float, float]] = []
    original = worker._serve

    async def serve(sock):  # type: ignore[no-untyped-def]
        task = asyncio.ensure_future(_sample(lags))
        try:
            await original(sock)
        finally:
            task.cancel()

    worker._serve = serve  # type: ignore[assignment]
    try:
        worker.main([fd])
    finally:
        _report(lags, "worker")


def probed_serve(argv: list[str]) -> None:
    """`taotrace serve` (one process, or the supervisor of a group whose workers are probed)."""
    from proxy.config.settings import Settings
    from proxy.serve import configure_logging
    from proxy.server.lifecycle import Shutdown, run_loop
    from proxy.workers import supervisor

    settings = Settings(**json.loads(argv[0]))
    configure_logging("warning")
    lags: list[tuple[float, float]] = []

    async def main() -> None:
        shutdown = Shutdown().install()
        task = asyncio.ensure_future(_sample(lags))
        try:
            if settings.workers > 1:
                command = (sys.executable, __file__, "--probed-worker")
                async with supervisor.supervising(settings, worker_command=command) as group:
                    print("LISTEN", group.proxy_url, group.metrics_url, flush=True)
                    await shutdown.wait()
            else:
                from proxy.serve import LOOP_SWITCH_INTERVAL, running

                sys.setswitchinterval(LOOP_SWITCH_INTERVAL)  # as `taotrace serve` does
                async with running(settings) as srv:
                    gc.freeze()
                    print("LISTEN", srv.proxy_url, srv.metrics_url, flush=True)
                    await shutdown.wait()
        finally:
            task.cancel()

    try:
        run_loop(main())
    finally:
        _report(lags, "supervisor" if settings.workers > 1 else "proxy")


# ---- the load and the scrapes ------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def run(args: argparse.Namespace) -> None:
    upstream = await FakeUpstream(upstream_handler(20, 0.005)).start()
    lag_dir = tempfile.mkdtemp(prefix="taotrace-lag-")
    settings = {"upstream": upstream.url, "port": 0, "metrics_port": 0, "workers": args.workers, "drain_seconds": 1}
    sink = await OTLPSink().start() if args.export else None
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url} if sink is not None else {"OTEL_TRACES_EXPORTER": "none"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--probed-serve", json.dumps(settings),
        stdout=asyncio.subprocess.PIPE, env={**env, **otel, "LAG_DIR": lag_dir, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None
    line = (await proc.stdout.readline()).decode().split()
    proxy_url, metrics_url = line[1], line[2]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def one(path: str, model: str) -> float:
            t = time.perf_counter()
            async with s.post(proxy_url + path, json={"model": model, "stream": True}) as r:
                async for _ in r.content.iter_any():
                    break
                ttft = time.perf_counter() - t
                await r.read()
            return ttft

        # fill: 101 model names on each api (the cap is 100, then `other`), and `other` itself
        names = [f"model-{i}" for i in range(101)]
        for path in [*APIS.values(), "/v1/other"]:
            await asyncio.gather(*(one(path, m) for m in names))
        async with s.get(metrics_url + "/metrics", headers={"Accept": PROMETHEUS_ACCEPT}) as r:
            page = await r.read()
        print(f"page: {len(page) / 1e6:.1f} MB, {page.count(NL)} lines (OpenMetrics)")
        window = (time.time(), time.time() + args.seconds)
        stop = time.monotonic() + args.seconds
        ttfts: list[float] = []
        scrapes: list[float] = []

        async def streamer(i: int) -> None:
            while time.monotonic() < stop:
                ttfts.append(await one(APIS["chat"], names[i % 100]))

        async def scraper() -> None:
            while time.monotonic() < stop and args.scrape:
                t = time.perf_counter()
                async with s.get(metrics_url + "/metrics", headers={"Accept": PROMETHEUS_ACCEPT}) as r:
                    await r.read()
                scrapes.append(time.perf_counter() - t)
                await asyncio.sleep(max(0.0, args.interval - (time.perf_counter() - t)))

        await asyncio.gather(scraper(), *(streamer(i) for i in range(args.streams)))
    proc.send_signal(signal.SIGTERM)
    await proc.wait()
    await upstream.close()
    mode = f"workers {args.workers}"
    exported = f"{len(sink.spans())} spans exported" if sink is not None else "no export"
    if sink is not None:
        await sink.close()
    print(f"{mode}: {len(ttfts)} streams of 20 tokens, {args.streams} at a time, {args.seconds:g} s; {exported}")
    print(f"  client TTFT p50 {pct(ttfts, 0.5) * 1e3:.1f} ms, p99 {pct(ttfts, 0.99) * 1e3:.1f} ms")
    if scrapes:
        median, worst = statistics.median(scrapes) * 1e3, max(scrapes) * 1e3
        print(f"  /metrics scrape: {len(scrapes)}, median {median:.0f} ms, max {worst:.0f} ms")
    for f in sorted(Path(lag_dir).glob("*.json")):
        lags = [lag for t, lag in json.loads(f.read_text()) if window[0] <= t <= window[1]]
        if lags:
            print(
                f"  loop lag {f.stem}: p50 {pct(lags, 0.5) * 1e3:.2f} ms, p99 {pct(lags, 0.99) * 1e3:.2f} ms,"
                f" max {max(lags) * 1e3:.1f} ms ({len(lags)} samples)"
            )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--probed-worker":
        probed_worker(sys.argv[2])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--probed-serve":
        probed_serve(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds from one scrape's start to the next")
    parser.add_argument("--no-scrape", dest="scrape", action="store_false", help="the same load without scrapes")
    parser.add_argument(
        "--no-export", dest="export", action="store_false", help="no span export (OTEL_TRACES_EXPORTER=none)"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
