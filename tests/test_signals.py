"""Ctrl-C as a person presses it, on real processes: the first SIGINT/SIGTERM drains, the second
cuts what is in flight at once, and the end of the drain says how many finished and were cut.
For `taotrace serve`, `taotrace sim` and `taotrace demo`."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.bars import TIMING_BARS, fired_on_time
from tests.fakes import FakeUpstream, chat_stream, stream_handler

ROOT = Path(__file__).resolve().parents[1]
CHAT = "/v1/chat/completions"
BODY = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
STALL = {**BODY, "messages": [{"role": "user", "content": "[sim:stall] hi"}]}  # the sim goes silent 30 s
CUT_AT_ONCE = 3.0  # seconds from the second signal to the process's end (measured: well under 1 s)


class Command:
    """`python -m proxy ARGS` with stdout and stderr in files."""

    def __init__(self, *args: str) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="taotrace-sig-")
        self.out_path = Path(self._dir.name) / "out.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TAOTRACE_"))}
        env["PYTHONPATH"] = str(ROOT)
        self._out = open(self.out_path, "wb")  # closed in close()
        self._final: str | None = None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", *args], cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT
        )

    def text(self) -> str:
        """Everything it printed so far (after `close`, all of it)."""
        if self._final is not None:
            return self._final
        return self.out_path.read_bytes().decode("utf-8", "replace")

    async def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found
            if self.proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in:\n{self.text()}")

    def signal(self, sig: int = signal.SIGINT) -> float:
        self.proc.send_signal(sig)
        return time.monotonic()

    async def exited(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"still running {timeout}s later:\n{self.text()}")
            await asyncio.sleep(0.02)
        return time.monotonic()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._final = self.text()
        self._out.close()
        self._dir.cleanup()


async def _read(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> str:
    """'whole', or 'cut' when the connection ended mid-body."""
    try:
        async with session.post(url, json=body) as response:
            async for _ in response.content.iter_any():
                pass
        return "whole"
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
        return "cut"


@pytest.fixture
async def slow_upstream() -> AsyncIterator[FakeUpstream]:
    """`/long/...` streams for ~40 s, anything else for ~0.5 s."""

    async def route(request):
        gap = 2.0 if request.path.startswith("/long/") else 0.02
        return await stream_handler(chat_stream(20), gap=gap)(request)

    fake = await FakeUpstream(route).start()
    yield fake
    await fake.close()


async def _serve(upstream: FakeUpstream, drain: float = 30.0) -> tuple[Command, str]:
    cmd = Command(
        "serve", "--upstream", upstream.url, "--port", "0", "--metrics-port", "0", "--drain-seconds", str(drain)
    )
    found = await cmd.wait_for(r"taotrace proxy on (http://\S+) ->")
    return cmd, found.group(1)


@pytest.mark.timeout(60)
async def test_serve_a_second_ctrl_c_cuts_at_once_and_the_drain_is_counted(slow_upstream: FakeUpstream) -> None:
    cmd, url = await _serve(slow_upstream)
    try:
        async with aiohttp.ClientSession() as session:
            streams = [asyncio.ensure_future(_read(session, url + "/long" + CHAT, BODY)) for _ in range(2)]
            await asyncio.sleep(0.5)  # both under way
            cmd.signal()
            await cmd.wait_for(r"draining: up to 30s for 2 requests in flight; a second Ctrl-C or SIGTERM cuts them")
            await asyncio.sleep(0.5)
            assert cmd.proc.poll() is None  # the first Ctrl-C drains: streams go on
            second = cmd.signal()
            ended = await cmd.exited(CUT_AT_ONCE)
            assert await asyncio.gather(*streams) == ["cut", "cut"]
    finally:
        cmd.close()
    assert "drain done: 0 requests finished, 2 cut (a second signal)" in cmd.text(), cmd.text()
    assert cmd.proc.returncode == 0
    print(f"\nsecond SIGINT -> exit in {ended - second:.2f} s")


@pytest.mark.timeout(60)
async def test_serve_one_sigterm_lets_streams_finish_and_says_so(slow_upstream: FakeUpstream) -> None:
    cmd, url = await _serve(slow_upstream, drain=10)
    try:
        async with aiohttp.ClientSession() as session:
            streams = [asyncio.ensure_future(_read(session, url + CHAT, BODY)) for _ in range(3)]
            await asyncio.sleep(0.1)
            cmd.signal(signal.SIGTERM)
            assert await asyncio.gather(*streams) == ["whole"] * 3
            await cmd.exited(10)
    finally:
        cmd.close()
    assert "drain done: 3 requests finished, 0 cut" in cmd.text(), cmd.text()


@pytest.mark.timeout(60)
async def test_sim_a_second_ctrl_c_cuts_a_stalled_stream_at_once() -> None:
    cmd = Command("sim", "--port", "0")
    try:
        url = (await cmd.wait_for(r"taotrace sim: (http://\S+) "))[1]
        async with aiohttp.ClientSession() as session:
            stream = asyncio.ensure_future(_read(session, url + "/chat/completions", STALL))
            await asyncio.sleep(0.5)
            cmd.signal()
            cmd.signal(signal.SIGTERM)
            await cmd.exited(CUT_AT_ONCE)
            assert await stream == "cut"
    finally:
        cmd.close()
    assert "taotrace sim: stopped; 0 requests finished, 1 cut (a second signal)" in cmd.text(), cmd.text()


@pytest.mark.timeout(60)
async def test_sim_one_ctrl_c_gives_streams_a_second_then_cuts() -> None:
    cmd = Command("sim", "--port", "0")
    try:
        url = (await cmd.wait_for(r"taotrace sim: (http://\S+) "))[1]
        async with aiohttp.ClientSession() as session:
            stream = asyncio.ensure_future(_read(session, url + "/chat/completions", STALL))
            await asyncio.sleep(0.5)
            sent = cmd.signal()
            ended = await cmd.exited(5)
            assert await stream == "cut" and 0.9 < ended - sent < 4
    finally:
        cmd.close()
    assert "stopped; 0 requests finished, 1 cut (the 1s deadline)" in cmd.text(), cmd.text()


QUICK_DEMO = ("demo", "--port", "0", "--metrics-port", "0", "--time-scale", "0.1", "--max-tokens", "4",
              "--base-tokens", "100", "--cache-tokens", "200")  # fmt: skip


@pytest.mark.timeout(90)
async def test_demo_a_second_ctrl_c_cuts_what_its_proxy_still_serves() -> None:
    cmd = Command(*QUICK_DEMO)
    try:
        url = (await cmd.wait_for(r"The proxy keeps running: (http://\S+) ->"))[1]
        await cmd.wait_for("Ctrl-C to stop")
        async with aiohttp.ClientSession() as session:
            stream = asyncio.ensure_future(_read(session, url + CHAT, STALL))  # through the proxy to the sim
            await asyncio.sleep(0.5)
            cmd.signal()
            await asyncio.sleep(0.5)
            assert cmd.proc.poll() is None  # draining: the stream may still finish
            cmd.signal()
            await cmd.exited(CUT_AT_ONCE)
            assert await stream == "cut"
    finally:
        cmd.close()
    assert "drain done: 0 requests finished, 1 cut (a second signal)" in cmd.text(), cmd.text()
    assert cmd.proc.returncode == 0


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["sigint", "sigterm"])
async def test_demo_ctrl_c_during_the_experiments_stops_them(sig: signal.Signals, status: int) -> None:
    cmd = Command("demo", "--port", "0", "--metrics-port", "0", "--max-tokens", "400")  # ~40 s of runs
    try:
        await asyncio.sleep(3.0)  # started, and the first runs are under way
        assert cmd.proc.poll() is None and "streaming runs" not in cmd.text()
        sent = cmd.signal(sig)
        ended = await cmd.exited(CUT_AT_ONCE)
    finally:
        cmd.close()
    assert cmd.proc.returncode == status and "demo: interrupted" in cmd.text(), cmd.text()  # 128 + the signal
    assert "Traceback" not in cmd.text()
    print(f"\n{sig.name} during the experiments -> exit in {ended - sent:.2f} s")


@TIMING_BARS
async def test_drain_counts_what_finished_and_what_was_cut(strict: bool) -> None:
    from proxy.server.lifecycle import drain

    quick = asyncio.ensure_future(asyncio.sleep(0.05))
    slow = asyncio.ensure_future(asyncio.sleep(30))
    t = time.monotonic()
    done = await drain({quick, slow}, deadline=0.5)
    assert (done.finished, done.cut, done.hurried) == (1, 1, False)
    fired_on_time(time.monotonic() - t, 0.5, strict=strict, early=0.1, late=1.5)  # not the slow task's 30 s
    assert done.describe(0.5) == "1 request finished, 1 cut (the 0.5s deadline)"
    await asyncio.sleep(0)
    assert slow.cancelled()

    now = asyncio.Event()
    slow = asyncio.ensure_future(asyncio.sleep(30))
    asyncio.get_running_loop().call_later(0.1, now.set)
    t = time.monotonic()
    done = await drain({slow}, deadline=30, now=now)
    assert (done.finished, done.cut, done.hurried) == (0, 1, True)
    fired_on_time(time.monotonic() - t, 0.1, strict=strict, early=0.1, late=1.9)  # the signal, not the 30 s deadline
    assert done.describe(30) == "0 requests finished, 1 cut (a second signal)"
