"""The live view's costs: ring memory per request, `observe` time per request, and the proxy's
event-loop lag while a page polls the API under 32 concurrent streams.

    python tests/bench/ui.py                 # all three (about a minute)
    python tests/bench/ui.py --seconds 20    # longer load phases

Loop lag: a task in the proxy's own loop sleeps 1 ms over and over and records how late it
wakes. Phase A: 32 streams of 256 tokens (tests/bench/load.py, another process) against the
bench upstream (tests/bench/upstream.py). Phase B: the same, plus a poller process fetching
what the page fetches, harder than the page does: `/api/requests?limit=1000` and
`/api/summary` every 250 ms (the page asks for new rows only, once a second).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import socket
import statistics
import subprocess
import sys
import time
import timeit
import tracemalloc
import urllib.request
from dataclasses import replace
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from proxy.config.settings import Settings  # noqa: E402
from proxy.dialects import Usage  # noqa: E402
from proxy.exchange.record import RequestRecord  # noqa: E402
from proxy.exchange.timing import PhaseClock  # noqa: E402
from proxy.serve import running  # noqa: E402
from proxy.ui import LiveView  # noqa: E402

HERE = Path(__file__).resolve().parent


def make_record(i: int, tokens: int, *, stream: bool = True) -> RequestRecord:
    clock = PhaseClock(1.0)
    clock.sent(1.0005)
    clock.headers(1.001)
    clock.body_bytes(1.002)
    for k in range(tokens if stream else 0):
        clock.chunk(1.05 + k * 0.01 + (k % 7) * 1e-4)
        clock.token(1.05 + k * 0.01 + (k % 7) * 1e-4)
    timing = clock.finish(2.0 + tokens * 0.01, tokens, streaming=stream)
    return RequestRecord(
        trace_id=f"{i:032x}", api="chat_completions", operation="chat", model="gpt-4o-mini",
        response_model="gpt-4o-mini-2024-07-18", stream=stream, method="POST", path="/v1/chat/completions",
        status_code=200, error_type="", timing=timing, usage=Usage(1043, tokens, 0, None), usage_source="reported",
        finish_reasons=("stop",), response_id=f"chatcmpl-{i:024x}",
    )  # fmt: skip


def memory(n: int = 1000) -> dict[str, float]:
    """Bytes the ring and window hold per request, by kind of request."""
    out = {}
    for label, tokens, stream in (("non-streaming", 0, False), ("stream, 48 tokens", 48, True),
                                  ("stream, 256 tokens", 256, True), ("stream, 4000 tokens", 4000, True)):  # fmt: skip
        gc.collect()
        tracemalloc.start()
        live = LiveView(n)
        base = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            live.observe(make_record(i, tokens, stream=stream))  # the record is the ring's only reference
        gc.collect()
        out[label] = (tracemalloc.get_traced_memory()[0] - base) / n
        tracemalloc.stop()
        del live
    return out


def window_memory() -> float:
    """Bytes of the 15-minute window at its worst: 30 buckets x 11 models, TTFT and TPOT spread over
    three decades (every 5 % bucket of the histograms in use)."""
    import random

    rng = random.Random(1)
    base = make_record(0, 48)
    models = [replace(base, model=f"model-{m}") for m in range(11)]
    gc.collect()
    tracemalloc.start()
    live = LiveView(1, clock=lambda: 0.0)
    start = tracemalloc.get_traced_memory()[0]
    for bucket in range(30):
        for rec in models:
            for _ in range(300):
                t = replace(rec.timing, ttft=10 ** rng.uniform(-2, 1), tpot=10 ** rng.uniform(-3, 0))
                live.window.add(replace(rec, timing=t), bucket * 30.0)
    used = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    return used


def observe_cost() -> dict[str, float]:
    """Microseconds per `LiveView.observe`, the only per-request work on the event loop."""
    out = {}
    for label, tokens in (("stream, 48 tokens", 48), ("stream, 4000 tokens (compacted)", 4000)):
        records = [make_record(i, tokens) for i in range(2000)]
        live = LiveView(1000)
        it = iter(records * 50)
        n = 20000 if tokens < 1000 else 2000
        best = min(timeit.repeat(lambda: live.observe(next(it)), number=n, repeat=3)) / n  # noqa: B023
        out[label] = best * 1e6
    return out


def reset(live: LiveView) -> None:
    for b in live.window._buckets:
        b.points = None


def serving_cost() -> dict[str, float]:
    """Milliseconds the loop is held by the longest step of each API answer (1,000 rows, full window)."""
    from proxy.ui.render import row
    from proxy.ui.ring import Query, distinct, select
    from proxy.ui.web import ROWS_PER_SLICE

    live = LiveView(1000, clock=lambda: 0.0)
    for i in range(1000):
        live.observe(make_record(i, 48))
    entries = live.ring.snapshot()
    chosen = select(entries, Query(limit=1000))

    def best(fn: object, n: int = 20) -> float:
        return min(timeit.repeat(fn, number=1, repeat=n)) * 1e3  # type: ignore[arg-type]

    rows = [row(e) for e in chosen]
    window_live = LiveView(10, clock=lambda: 0.0)
    for bucket in range(30):  # 15 minutes, 10 models, 50 requests each per bucket
        for m in range(10):
            for i in range(50):
                rec = make_record(i, 48)
                window_live.window.add(
                    rec.__class__(**{**{f: getattr(rec, f) for f in rec.__dataclass_fields__}, "model": f"m{m}"}),
                    bucket * 30.0,
                )
    return {
        "requests: snapshot + select 1000": best(lambda: select(live.ring.snapshot(), Query(limit=1000))),
        f"requests: one slice of {ROWS_PER_SLICE} rows": best(lambda: [row(e) for e in chosen[:ROWS_PER_SLICE]]),
        "requests: distinct apis/models": best(lambda: distinct(entries)),
        "requests: orjson of 1000 rows": best(lambda: orjson.dumps({"requests": rows})),
        "summary: one prepare step (4 closed buckets x 10 models)": best(
            lambda: (reset(window_live), window_live.window.prepare(899.0)), n=5
        ),
        "summary: snapshot once prepared (30 buckets x 10 models)": best(lambda: window_live.window.snapshot(899.0)),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poll(base: str, seconds: float, interval: float) -> None:
    """The poller process: fetch what the page fetches, report the answers' latencies."""
    took: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for path in ("/api/requests?limit=1000", "/api/summary"):
            t = time.perf_counter()
            with urllib.request.urlopen(base + path, timeout=10) as response:
                response.read()
            took.append(time.perf_counter() - t)
        time.sleep(interval)
    took.sort()
    print(json.dumps({"polls": len(took), "p50_ms": took[len(took) // 2] * 1e3, "max_ms": took[-1] * 1e3}))


async def lag_probe(stop: asyncio.Event, lags: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - t - 0.001)


def summarize(lags: list[float]) -> dict[str, float]:
    lags = sorted(lags)
    q = statistics.quantiles(lags, n=100)
    return {"p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3, "max_ms": lags[-1] * 1e3, "samples": len(lags)}


async def loop_lag(seconds: float) -> dict[str, object]:
    up_port = free_port()
    upstream = subprocess.Popen([sys.executable, str(HERE / "upstream.py"), "--port", str(up_port)])
    results: dict[str, object] = {}
    try:
        await asyncio.sleep(1.0)
        settings = Settings(upstream=f"http://127.0.0.1:{up_port}", port=0, metrics_port=0)
        sys.setswitchinterval(0.001)  # as `taotrace serve` does
        async with running(settings) as srv:
            port = srv.proxy_url.rsplit(":", 1)[1]
            for phase, polling in (("A: 32 streams", False), ("B: 32 streams + page polling", True)):
                lags: list[float] = []
                stop = asyncio.Event()
                probe = asyncio.create_task(lag_probe(stop, lags))
                load = await asyncio.create_subprocess_exec(
                    sys.executable, str(HERE / "load.py"), "--port", port, "--concurrency", "32",
                    "--tokens", "256", "--seconds", str(seconds), stdout=subprocess.PIPE,
                )  # fmt: skip
                poller = None
                if polling:
                    poller = await asyncio.create_subprocess_exec(
                        sys.executable, __file__, "--poll", srv.metrics_url, "--seconds", str(seconds - 1),
                        stdout=subprocess.PIPE,
                    )  # fmt: skip
                load_out, _ = await load.communicate()
                stop.set()
                await probe
                row: dict[str, object] = {"loop_lag": summarize(lags), "load": load_out.decode().strip()}
                if poller is not None:
                    poll_out, _ = await poller.communicate()
                    row["poller"] = json.loads(poll_out)
                results[phase] = row
            assert srv.live is not None
            results["ring"] = len(srv.live.ring)
    finally:
        upstream.terminate()
        upstream.wait()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--poll", metavar="BASE_URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.poll:
        poll(args.poll, args.seconds, 0.25)
        return
    print("ring memory, bytes per request:", json.dumps({k: round(v) for k, v in memory().items()}))
    print("window memory at its worst, MB:", round(window_memory() / 1e6, 2))
    print("observe, us per request:", json.dumps({k: round(v, 2) for k, v in observe_cost().items()}))
    print("serving, ms the loop is held:", json.dumps({k: round(v, 2) for k, v in serving_cost().items()}, indent=2))
    print("loop lag:", json.dumps(asyncio.run(loop_lag(args.seconds)), indent=2))


if __name__ == "__main__":
    main()
