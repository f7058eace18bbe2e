"""SIGTERM with 50 streams in flight, against a real `taotrace serve` process."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from tests.adversarial.proc import ProxyProcess
from tests.adversarial.util import BODY, CHAT, Upstream
from tests.fakes import chat_stream, stream_handler

FRAMES = chat_stream(20)  # 23 frames


async def _stream(session: aiohttp.ClientSession, url: str, path: str) -> tuple[str, bytes]:
    """'whole', 'cut' (connection aborted mid-body), or 'refused'/'error: ...'."""
    got = b""
    try:
        async with session.post(url + path, data=BODY) as resp:
            async for chunk in resp.content.iter_any():
                got += chunk
        return "whole", got
    except aiohttp.ClientPayloadError:
        return "cut", got
    except aiohttp.ClientConnectorError:
        return "refused", got
    except aiohttp.ClientError as exc:
        return f"error: {type(exc).__name__}", got


async def _refused_after(url: str, since: float) -> float:
    """Seconds from `since` until a new TCP connect to the proxy is refused."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    while True:
        try:
            _, w = await asyncio.open_connection(host, int(port))
            w.close()
        except (ConnectionRefusedError, ConnectionResetError):
            # Refused, or reset: a connect that reached the accept queue just as the listening
            # socket closed is reset by the kernel. Either way the proxy no longer takes connections.
            return time.monotonic() - since
        await asyncio.sleep(0.01)


async def _drain(short: int, long: int, drain: float) -> dict[str, Any]:
    async def route(request):
        gap = 0.05 if request.path.startswith("/short/") else 2.0
        return await stream_handler(FRAMES, gap=gap)(request)  # short: ~1.1 s; long: ~44 s

    async with Upstream(route) as up:
        proc = ProxyProcess("--upstream", up.url, "--drain-seconds", str(drain))
        try:
            await proc.started()
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                tasks = [asyncio.ensure_future(_stream(session, proc.url, "/short" + CHAT)) for _ in range(short)]
                tasks += [asyncio.ensure_future(_stream(session, proc.url, "/long" + CHAT)) for _ in range(long)]
                await asyncio.sleep(0.4)  # every stream is under way
                sent = proc.terminate()
                refused = await _refused_after(proc.url, sent)
                async with session.get(proc.metrics_url + "/readyz") as resp:
                    ready = resp.status
                results = await asyncio.gather(*tasks)
                ended = await proc.exited(drain + 10)
        finally:
            proc.close()
    return {"results": results, "refused": refused, "readyz": ready, "exit": ended - sent}


@pytest.mark.timeout(60)
async def test_sigterm_lets_50_streams_finish_whole() -> None:
    out = await _drain(short=50, long=0, drain=5.0)
    kinds = [k for k, _ in out["results"]]
    assert kinds == ["whole"] * 50, kinds
    assert all(body == b"".join(FRAMES) for _, body in out["results"])
    assert out["refused"] < 0.3, out["refused"]  # new connections refused at once
    assert out["readyz"] == 503
    assert out["exit"] < 5.0 + 2.0, out["exit"]
    print(f"\n50 streams whole; refused new connections after {out['refused'] * 1000:.0f} ms; exit {out['exit']:.2f} s")


@pytest.mark.timeout(60)
async def test_sigterm_aborts_streams_still_running_at_the_deadline() -> None:
    drain = 2.0
    out = await _drain(short=40, long=10, drain=drain)
    kinds = [k for k, _ in out["results"]]
    assert kinds[:40] == ["whole"] * 40, kinds
    assert kinds[40:] == ["cut"] * 10, kinds  # aborted: never a clean, truncated end
    assert all(b"".join(FRAMES).startswith(body) and body != b"".join(FRAMES) for _, body in out["results"][40:])
    assert out["refused"] < 0.3, out["refused"]
    assert drain - 0.2 < out["exit"] < drain + 2.0, out["exit"]
    print(f"\n40 whole, 10 cut at the {drain:g} s deadline; exit after {out['exit']:.2f} s")
