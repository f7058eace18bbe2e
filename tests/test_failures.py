"""The failure behaviours a proxy must have: every one exercised over real sockets."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
from aiohttp import web

from tests.bars import TIMING_BARS, fired_on_time
from tests.conftest import Proxied
from tests.fakes import chat_stream, stream_handler


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@TIMING_BARS
async def test_connection_refused_is_a_fast_502(start_proxy, client: aiohttp.ClientSession, strict: bool) -> None:
    async with start_proxy(upstream=f"http://127.0.0.1:{free_port()}") as p:
        started = time.monotonic()
        async with client.post(p.url + "/v1/chat/completions?key=SECRET", json={"model": "m", "stream": True}) as r:
            body = await r.json()
        assert r.status == 502
        fired_on_time(time.monotonic() - started, 0.0, strict=strict, late=1.0)  # not the 10 s connect timeout
        assert body["error"]["type"] == "connect" and body["error"]["message"].startswith("taotrace: ")
        assert "SECRET" not in str(body)
        assert p.records[-1].error_type == "connect"


@TIMING_BARS
async def test_connect_timeout_is_a_504(
    start_proxy, client: aiohttp.ClientSession, blackhole: int, strict: bool
) -> None:
    async with start_proxy(upstream=f"http://127.0.0.1:{blackhole}", connect_timeout=0.5) as p:
        started = time.monotonic()
        async with client.post(p.url + "/v1/chat/completions", json={"model": "m"}) as r:
            body = await r.json()
        elapsed = time.monotonic() - started
        assert r.status == 504 and body["error"]["type"] == "timeout"
        fired_on_time(elapsed, 0.5, strict=strict, early=0.05, late=1.0)
        assert p.records[-1].error_type == "timeout"


async def test_silent_upstream_is_a_504_before_headers(start_proxy, client: aiohttp.ClientSession, upstream) -> None:
    async def silent(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    upstream.handler = silent
    async with start_proxy(read_timeout=0.5) as p:
        async with client.post(p.url + "/v1/chat/completions", json={"model": "m"}) as r:
            assert r.status == 504


async def test_post_is_never_retried(start_proxy, client: aiohttp.ClientSession, upstream) -> None:
    async def slam(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()  # reset before any response byte
        raise ConnectionResetError

    upstream.handler = slam
    async with start_proxy() as p:
        async with client.post(p.url + "/v1/chat/completions", json={"model": "m"}) as r:
            assert r.status == 502
        assert len(upstream.seen) == 1
        assert p.records[-1].error_type == "upstream_error"


async def test_upstream_dying_mid_stream_cuts_the_client(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    frames = chat_stream(10)

    async def dies(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame in frames[:5]:
            await resp.write(frame)
            await asyncio.sleep(0.01)
        assert request.transport is not None
        request.transport.close()  # no terminating chunk
        return resp

    proxy.serve(dies)
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
            async for data in r.content.iter_any():
                received += data
    assert received == b"".join(frames[:5])  # everything that arrived was delivered
    await asyncio.sleep(0.05)
    assert proxy.records[-1].error_type == "stream_cut"
    root = proxy.spans("chat m")[-1]
    assert root.attributes["error.type"] == "stream_cut"


@pytest.mark.parametrize("when", ["prefill", "decode"])
async def test_client_disconnect_cancels_the_upstream(when: str, proxy: Proxied) -> None:
    frames = chat_stream(200)
    proxy.serve(stream_handler(frames, first_delay=5.0 if when == "prefill" else 0.0, gap=0.05))
    session = aiohttp.ClientSession()
    resp_cm = session.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True})
    if when == "prefill":
        task = asyncio.ensure_future(resp_cm.__aenter__())
        await asyncio.sleep(0.3)
        task.cancel()
    else:
        r = await resp_cm.__aenter__()
        await r.content.readany()
        await asyncio.sleep(0.2)
        r.close()
    closed_at = asyncio.get_running_loop().time()
    await session.close()
    for _ in range(50):
        if proxy.upstream.disconnected:
            break
        await asyncio.sleep(0.02)
    assert proxy.upstream.disconnected, "the upstream never saw the client leave"
    assert proxy.upstream.disconnected[0] - closed_at < 1.0
    for _ in range(50):
        if proxy.records:
            break
        await asyncio.sleep(0.02)
    assert proxy.records[-1].error_type == "client_abort"
    assert (
        proxy.srv.registry.get_sample_value(
            "taotrace_in_flight_requests", {"upstream": "127.0.0.1", "api": "chat_completions"}
        )
        == 0
    )


@TIMING_BARS
async def test_collector_down_changes_nothing(upstream, client: aiohttp.ClientSession, strict: bool) -> None:
    from proxy.config.settings import Settings
    from proxy.serve import running
    from proxy.telemetry.tracing import build_tracing, shutdown_tracing

    upstream.handler = stream_handler(chat_stream(5))
    provider = build_tracing(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    )
    async with running(Settings(upstream=upstream.url, port=0, metrics_port=0), tracing=provider) as srv:
        for _ in range(20):
            async with client.post(srv.proxy_url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                assert r.status == 200
                await r.read()
    started = time.monotonic()
    shutdown_tracing(provider, timeout=2.0)
    fired_on_time(time.monotonic() - started, 2.0, strict=strict, early=2.0, late=0.5)  # not the SDK's 30 s


@pytest.mark.parametrize("mode", ["--workers 1", "--workers 2"])
def test_sigterm_drains_in_flight_streams_then_exits(tmp_path, mode: str) -> None:
    """A real `taotrace serve` process (or group): in-flight streams finish, new connections are refused."""
    script = tmp_path / "drain_client.py"
    script.write_text(DRAIN_CLIENT)
    port, mport = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    result = subprocess.run(
        [sys.executable, str(script), str(port), str(mport), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout


DRAIN_CLIENT = r"""
import asyncio, os, signal, sys, time, aiohttp
from aiohttp import web
sys.path.insert(0, os.getcwd())
from tests.fakes import FakeUpstream, chat_stream, stream_handler

async def main(port, mport, mode):
    up = await FakeUpstream(stream_handler(chat_stream(30), gap=0.05)).start()  # ~1.5 s streams
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "proxy", "serve", "--upstream", up.url,
        "--port", port, "--metrics-port", mport, "--drain-seconds", "5", *mode.split())
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as s:
        for _ in range(400):
            try:
                async with s.get(f"http://127.0.0.1:{mport}/readyz") as r:
                    if r.status == 200: break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        async def one():
            async with s.post(base + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                return await r.read()
        tasks = [asyncio.ensure_future(one()) for _ in range(10)]
        await asyncio.sleep(0.4)
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        async with s.get(f"http://127.0.0.1:{mport}/readyz") as r:
            assert r.status == 503, r.status
        try:
            async with aiohttp.ClientSession() as fresh:
                async with fresh.get(base + "/v1/models") as r:
                    raise AssertionError(f"new connection accepted during drain: {r.status}")
        except aiohttp.ClientConnectorError:
            pass
        bodies = await asyncio.gather(*tasks)
        expected = b"".join(chat_stream(30))
        assert all(b == expected for b in bodies), "a stream was not whole"
    rc = await asyncio.wait_for(proc.wait(), 10)
    assert rc == 0, rc
    assert time.monotonic() - t_term < 5 + 2
    await up.close()
    print("OK")

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""
