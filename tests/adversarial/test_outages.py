"""Telemetry outages under load: the OTLP collector refuses, black-holes, answers 503 or answers
after 5 s while `taotrace serve` carries 100 streaming requests/s. Requests must not notice.

`make test` runs 6 s per collector mode and judges by what the machine's load cannot fake: every
request whole; while the collector holds an export (slow, black-holed), requests started in that
time end in it, which they could not if serving waited for the export; memory bounded; the exit
bound; and no event-loop stall near the exporters' own waits (retries back off 1 s and more; a
held export lasts 5-10 s), well above a loaded machine's scheduling noise. `pytest --soak` runs
the issue's 60 s per mode with its strict latency bars against a healthy-collector run (TTFT p99
within 5 ms, loop lag p99 under 5 ms): run it on a quiet machine.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
import pytest

from tests.adversarial.proc import OtlpSink, ProxyProcess
from tests.adversarial.util import BODY, CHAT, Upstream
from tests.fakes import chat_stream, stream_handler

RATE = 100  # streaming requests per second
DRAIN = 2.0
FRAMES = chat_stream(10)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


@dataclass
class Run:
    mode: str
    sent: int
    failed: int
    ttft_p50: float
    ttft_p99: float
    lag_p99: float
    lag_max: float
    rss_start: int
    rss_mid: int
    rss_peak: int
    scrape_max: float
    gc_max: float
    exit_after: float
    spans_received: int
    held_started: int  # requests started while the collector held an export
    held_served: int  # ... and ended before it let go

    def line(self) -> str:
        return (
            f"{self.mode:>9}: {self.sent} req, {self.failed} failed; client TTFT p50 {self.ttft_p50 * 1e3:.1f} ms "
            f"p99 {self.ttft_p99 * 1e3:.1f} ms; loop lag p99 {self.lag_p99 * 1e3:.2f} ms (max {self.lag_max * 1e3:.1f}); "
            f"RSS {self.rss_start / 2**20:.0f}->{self.rss_mid / 2**20:.0f}->{self.rss_peak / 2**20:.0f} MiB; "
            f"scrape max {self.scrape_max * 1e3:.0f} ms; GC pause max {self.gc_max * 1e3:.0f} ms; "
            f"exit {self.exit_after:.2f} s after SIGTERM; spans at sink {self.spans_received}; "
            f"{self.held_served} of {self.held_started} requests begun during a held export ended in it"
        )


async def _load(
    url: str, metrics_url: str, seconds: float
) -> tuple[int, int, list[float], list[float], list[tuple[float, float]]]:
    """Open loop: RATE streams/s for `seconds`, plus a /metrics scrape every second. Returns the
    count sent and failed, TTFTs, scrape times, and each request's (start, end) on perf_counter."""
    ttfts: list[float] = []
    windows: list[tuple[float, float]] = []
    scrapes: list[float] = []
    failed = 0
    expected = b"".join(FRAMES)

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal failed
        t = time.perf_counter()
        try:
            async with session.post(url + CHAT, data=BODY) as resp:
                first = await resp.content.readany()
                ttfts.append(time.perf_counter() - t)
                rest = await resp.read()
                if resp.status != 200 or first + rest != expected:
                    failed += 1
        except aiohttp.ClientError:
            failed += 1
        windows.append((t, time.perf_counter()))

    async def scrape(session: aiohttp.ClientSession) -> None:
        while True:
            t = time.perf_counter()
            async with session.get(metrics_url + "/metrics") as resp:
                await resp.read()
            scrapes.append(time.perf_counter() - t)
            await asyncio.sleep(1.0)

    n = int(RATE * seconds)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        scraper = asyncio.create_task(scrape(session))
        start = time.perf_counter()
        tasks = []
        for i in range(n):
            delay = start + i / RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session)))
        await asyncio.gather(*tasks)
        scraper.cancel()
    return n, failed, ttfts, scrapes, windows


def _during_holds(holds: list[list[float]], windows: list[tuple[float, float]]) -> tuple[int, int]:
    """Requests begun while an export was held, and how many of those ended before it was let go."""
    started = served = 0
    for start, end in windows:
        hold = next(((a, b) for a, b in holds if a <= start < b), None)
        if hold is not None:
            started += 1
            served += end < hold[1]
    return started, served


async def outage_run(mode: str, seconds: float) -> Run:
    sink = await OtlpSink(mode).start()
    try:
        async with Upstream(stream_handler(FRAMES, first_delay=0.02, gap=0.01)) as up:
            proc = ProxyProcess("--upstream", up.url, "--drain-seconds", str(DRAIN), env=sink.env())
            try:
                await proc.started()
                await asyncio.sleep(0.5)
                t_start = time.time()
                sent, failed, ttfts, scrapes, windows = await _load(proc.url, proc.metrics_url, seconds)
                t_end = time.time()
                term = proc.terminate()
                exited = await proc.exited(DRAIN + 15)
                report = proc.report()
            finally:
                proc.close()
    finally:
        await sink.close()
    lags = [lag for t, lag in report["lags"] if t_start <= t <= t_end]
    held_started, held_served = _during_holds(sink.holds, windows)
    rss = [r for t, r in report["rss"] if t_start <= t <= t_end]
    return Run(
        mode, sent, failed, pct(ttfts, 0.5), pct(ttfts, 0.99), pct(lags, 0.99), max(lags),
        rss[min(4, len(rss) - 1)], rss[len(rss) // 2], max(rss), max(scrapes), max([0.0] + [d for _, d in report["gc"]]), exited - term, len(sink.spans()) if mode == "ok" else 0,
        held_started, held_served,
    )  # fmt: skip


async def _compare(seconds: float, strict: bool) -> None:
    """`strict`: the issue's latency bars against the healthy run, which need a quiet machine.
    Otherwise (make test, shared 2-core machines) no latency is compared: two short runs' p99s
    differ by the machine's load alone (a healthy run's TTFT p99 was 29 ms in one and 186 ms in
    another; loop lag p99 12 ms and 44 ms). A collector that held up serving would show instead
    as requests waiting out a held export, and as a loop stall of a second or more."""
    healthy = await outage_run("ok", seconds)
    print("\n" + healthy.line())
    assert healthy.failed == 0
    assert healthy.spans_received > 0
    runs = [healthy]
    for mode in ("refused", "blackhole", "503", "slow"):
        run = await outage_run(mode, seconds)
        print(run.line())
        runs.append(run)
    for run in runs:
        assert run.failed == 0, run.line()
        if run.mode in ("slow", "blackhole"):
            # Serving never waits for an export: what began while one was held ended while it
            # still was (all but those begun in its last moments; none if serving waited).
            assert run.held_started >= RATE, run.line()
            assert run.held_served >= 0.5 * run.held_started, run.line()
        if strict:
            assert run.ttft_p99 - healthy.ttft_p99 < 0.005, run.line()
            assert run.lag_p99 < 0.005, run.line()
        assert run.lag_max < 1.0, run.line()  # no stall: the exporters wait 1 s and more
        # Bounded: the span queue (2048) fills and then drops; memory stops growing by mid-run.
        assert run.rss_peak - run.rss_start < 64 * 2**20, run.line()
        if seconds >= 30:
            assert run.rss_peak - run.rss_mid < 8 * 2**20, run.line()
        assert run.exit_after < DRAIN + 3.0, run.line()
        assert run.scrape_max < (0.25 if strict else 1.0), run.line()


@pytest.mark.timeout(300)
async def test_collector_outages_do_not_touch_requests() -> None:
    await _compare(6.0, strict=False)


@pytest.mark.soak
@pytest.mark.timeout(900)
async def test_collector_outages_soak_60s() -> None:
    await _compare(60.0, strict=True)


@pytest.mark.timeout(60)
async def test_exit_within_deadline_plus_3s_with_streams_in_flight_and_the_collector_black_holed() -> None:
    """The worst exit: streams run to the drain deadline, then spans cannot be flushed."""
    sink = await OtlpSink("blackhole").start()
    try:
        async with Upstream(stream_handler(FRAMES, gap=5.0)) as up:  # ~60 s streams
            proc = ProxyProcess("--upstream", up.url, "--drain-seconds", str(DRAIN), env=sink.env())
            try:
                await proc.started()
                async with aiohttp.ClientSession() as session:

                    async def one() -> None:
                        async with session.post(proc.url + CHAT, data=BODY) as resp:
                            await resp.read()

                    tasks = [asyncio.ensure_future(one()) for _ in range(10)]
                    await asyncio.sleep(1.0)
                    sent = proc.terminate()
                    results = await asyncio.gather(*tasks, return_exceptions=True)
                    exited = await proc.exited(DRAIN + 15)
            finally:
                proc.close()
    finally:
        await sink.close()
    assert all(isinstance(r, aiohttp.ClientPayloadError) for r in results), results  # cut at the deadline
    print(f"\nexit {exited - sent:.2f} s after SIGTERM (drain {DRAIN:g} s, collector black-holed)")
    assert exited - sent < DRAIN + 3.0
