"""A `--workers` supervisor's CPU per served request, at fixed request rates, every sink on.

    python tests/bench/supervisor_cpu.py --workers 2 --rates 100,400            # this tree
    python tests/bench/supervisor_cpu.py --workers 8 --rates 50,200             # 8 workers on 2 cores
    python tests/bench/supervisor_cpu.py --arm new=. --arm base=/tmp/base --rates 200   # two trees in turns

One bench upstream (`upstream.py`: 16-token streams, 20 ms to the first token, 1 ms between
tokens) and one OTLP sink (`otlp_sink.py`) serve every run. Each (arm, rate) run starts a fresh
`python -m proxy serve --workers N` from the arm's tree with every sink on: spans and OTLP
metrics exported to the sink (`OTEL_METRICS_EXPORTER=otlp`, every 5 s), /metrics scraped in
OpenMetrics (exemplars) every `--scrape` seconds, and two open live-view pages polled as the page
polls, once a second: the requests list (`/api/requests?limit=200&since=...`) and the overview
(`/api/summary`). The client opens `rate` streams a second, paced (open loop), on keep-alive
connections the kernel spreads over the workers.

After `--warmup` seconds, the supervisor's CPU (the `serve` process itself, every thread:
/proc/<pid>/task/*/schedstat, ns) and the workers' (its children) are read around `--seconds` of
load; per served request is CPU over the streams completed. `µs/s` is the supervisor's CPU per
second of wall time: flat across rates means its cost does not follow the requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import aiohttp  # noqa: E402
from client import MODEL, Pool, analyse, request_bytes  # noqa: E402
from procs import Proc, cpu_ns, free_port, tree, wait_port  # noqa: E402

PY = sys.executable
TOKENS = 16


async def _pages(metrics: str, scrape_every: float, stop: asyncio.Event, pages: bool = True) -> dict[str, int]:
    """Two open pages of the live view (unless not `pages`) and a scraper, until `stop`; how many
    of each were answered."""
    done = {"requests": 0, "summary": 0, "scrapes": 0}
    async with aiohttp.ClientSession() as s:

        async def requests_page() -> None:
            since = 0
            while pages and not stop.is_set():
                params = {"limit": "200", **({"since": str(since)} if since else {})}
                async with s.get(metrics + "/api/requests", params=params) as r:
                    since = (await r.json())["last_seq"]
                done["requests"] += 1
                await asyncio.sleep(1.0)

        async def overview_page() -> None:
            while pages and not stop.is_set():
                async with s.get(metrics + "/api/summary") as r:
                    await r.read()
                done["summary"] += 1
                await asyncio.sleep(1.0)

        async def scraper() -> None:
            while not stop.is_set():
                async with s.get(metrics + "/metrics", headers={"Accept": "application/openmetrics-text"}) as r:
                    await r.read()
                done["scrapes"] += 1
                await asyncio.sleep(scrape_every)

        await asyncio.gather(requests_page(), overview_page(), scraper())
    return done


async def _load(port: int, rate: float, seconds: float) -> tuple[int, int]:
    """`rate` streams a second for `seconds`, paced; (completed byte-exact, failed)."""
    pool = Pool("127.0.0.1", port)
    raw = request_bytes("127.0.0.1", port, "/v1/chat/completions", MODEL, TOKENS)
    ok = failed = 0

    async def one() -> None:
        nonlocal ok, failed
        (conn,), _ = await pool.acquire(1)
        resp = await conn.send(raw)
        pool.release([conn])
        if analyse(resp, MODEL, TOKENS).ok:
            ok += 1
        else:
            failed += 1

    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic()
    n = 0
    while (due := start + n / rate) < start + seconds:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        task = asyncio.ensure_future(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
    await asyncio.gather(*tasks)
    pool.close()
    return ok, failed


def _children_cpu(pid: int) -> int:
    return cpu_ns([p for p in tree(pid) if p != pid])


async def measure(
    src: Path, rate: float, args: argparse.Namespace, env: dict[str, str], logs: Path
) -> dict[str, float]:
    port, mport = free_port(), free_port()
    proc = Proc(
        "proxy",
        [PY, "-m", "proxy", "serve", "--upstream", f"http://127.0.0.1:{args.upstream}", "--port", str(port),
         "--metrics-port", str(mport), "--workers", str(args.workers), "--log-level", "warning"],
        logs / f"proxy-{src.name}-{rate:g}.log", env=env, cwd=str(src),
    ).start()  # fmt: skip
    try:
        wait_port(mport, 60, proc.popen)
        metrics = f"http://127.0.0.1:{mport}"
        async with aiohttp.ClientSession() as s:
            for _ in range(600):
                async with s.get(metrics + "/readyz") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.1)
        stop = asyncio.Event()
        pages = asyncio.ensure_future(_pages(metrics, args.scrape, stop, not args.no_pages))
        await _load(port, rate, args.warmup)
        sup0, work0, t0 = cpu_ns([proc.pid]), _children_cpu(proc.pid), time.monotonic()
        ok, failed = await _load(port, rate, args.seconds)
        sup1, work1, t1 = cpu_ns([proc.pid]), _children_cpu(proc.pid), time.monotonic()
        stop.set()
        polled = await pages
    finally:
        proc.stop()
    wall = t1 - t0
    return {
        "rate": rate,
        "served_per_s": ok / wall,
        "failed": failed,
        "supervisor_us_per_request": (sup1 - sup0) / 1e3 / max(ok, 1),
        "supervisor_us_per_s": (sup1 - sup0) / 1e3 / wall,
        "workers_us_per_request": (work1 - work0) / 1e3 / max(ok, 1),
        **{f"polled_{k}": v for k, v in polled.items()},
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", action="append", help="NAME=DIR (a directory with proxy/); default: this tree")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rates", default="100,400", help="streams a second, comma separated")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--scrape", type=float, default=5.0, help="seconds between scrapes of /metrics")
    ap.add_argument("--no-pages", action="store_true", help="no live-view page open (the scraper still scrapes)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--logs", type=Path, default=Path("/tmp/supervisor_cpu"))
    args = ap.parse_args()
    arms = {
        name: Path(d).resolve() for name, _, d in (a.partition("=") for a in args.arm or [f"this={HERE.parents[1]}"])
    }
    rates = [float(r) for r in args.rates.split(",")]
    args.logs.mkdir(parents=True, exist_ok=True)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TAOTRACE_"))}
    args.upstream, sink = free_port(), free_port()
    helpers = [
        Proc("upstream", [PY, str(HERE / "upstream.py"), "--port", str(args.upstream), "--ttft-ms", "20",
                          "--interval-ms", "1"], args.logs / "upstream.log", env=base_env).start(),
        Proc("sink", [PY, str(HERE / "otlp_sink.py"), "--port", str(sink)], args.logs / "sink.log", env=base_env).start(),
    ]  # fmt: skip
    wait_port(args.upstream, 30, helpers[0].popen)
    wait_port(sink, 30, helpers[1].popen)
    env = {
        **base_env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_METRIC_EXPORT_INTERVAL": "5000",
    }
    results: dict[tuple[str, float], list[dict[str, float]]] = {}
    try:
        for i in range(args.repeat):
            for rate in rates:
                for name, src in arms.items() if i % 2 == 0 else reversed(arms.items()):
                    got = await measure(src, rate, args, env, args.logs)
                    results.setdefault((name, rate), []).append(got)
                    print(json.dumps({"arm": name, **got}), flush=True)
    finally:
        for h in helpers:
            h.stop()
    pages = "no live-view page open" if args.no_pages else "every sink on"
    print(f"\n--workers {args.workers}, {TOKENS}-token streams, {pages} (median of {args.repeat}):")
    print(f"  {'arm':8} {'rate':>6} {'served/s':>9} {'sup us/req':>11} {'sup us/s':>10} {'workers us/req':>15}")
    for (name, rate), runs in results.items():

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        print(
            f"  {name:8} {rate:6g} {med('served_per_s'):9.0f} {med('supervisor_us_per_request'):11.1f} "
            f"{med('supervisor_us_per_s'):10.0f} {med('workers_us_per_request'):15.0f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
