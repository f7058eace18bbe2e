"""`python -m tests.adversarial.serve_probe [serve flags]`: `taotrace serve`, plus probes.

The same start as `taotrace serve` (settings from flags and environment, logging, uvloop), with
a task that measures event-loop lag (how late a 5 ms sleep wakes up) and the process's RSS, and
writes them as JSON to the file named by `$PROBE_REPORT` when the process exits.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time

from proxy.cli import parse
from proxy.config.config import load
from proxy.serve import Settings, configure_logging, serve

TICK = 0.005


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _sample(lags: list[tuple[float, float]], rss: list[tuple[float, int]]) -> None:
    next_rss = 0.0
    while True:
        # perf_counter, not loop.time(): uvloop's clock counts whole milliseconds.
        t = time.perf_counter()
        await asyncio.sleep(TICK)
        now = time.time()
        lags.append((now, time.perf_counter() - t - TICK))
        if now >= next_rss:
            rss.append((now, _rss()))
            next_rss = now + 0.25


async def _main(settings: Settings, lags: list[tuple[float, float]], rss: list[tuple[float, int]]) -> None:
    sampler = asyncio.create_task(_sample(lags, rss))
    try:
        await serve(load(settings))
    finally:
        sampler.cancel()


def _gc_pauses(pauses: list[tuple[int, float]]) -> None:
    """Record each garbage collection's generation and duration (a GC stops every thread)."""
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(callback)


def main(argv: list[str]) -> int:
    parsed = parse(["serve", *argv])
    assert parsed is not None and isinstance(parsed[1], Settings)
    settings = parsed[1]
    configure_logging(settings.log_level)
    lags: list[tuple[float, float]] = []
    rss: list[tuple[float, int]] = []
    pauses: list[tuple[int, float]] = []
    _gc_pauses(pauses)
    if os.environ.get("PROBE_GC_FREEZE"):
        gc.freeze()
    try:
        import uvloop

        uvloop.run(_main(settings, lags, rss))
    finally:
        report = os.environ.get("PROBE_REPORT")
        if report:
            with open(report, "w") as f:
                json.dump({"lags": lags, "rss": rss, "gc": pauses, "exited": time.time()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
