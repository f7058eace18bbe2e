"""The proxy's own cost: `taotrace_proxy_overhead_seconds{api,stage}` and the `Server-Timing` header."""

from __future__ import annotations

import asyncio
import re

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from tests.conftest import Proxied, ProxyFactory
from tests.fakes import chat_stream, stream_handler


async def test_overhead_histogram_counts_each_request_and_each_read(
    proxy: Proxied, client: aiohttp.ClientSession, registry: CollectorRegistry
) -> None:
    proxy.serve(stream_handler(chat_stream(5), gap=0.01))  # each frame its own write, 10 ms apart
    async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
        await r.read()
    rec = proxy.records[-1]

    def sample(stage: str, suffix: str) -> float | None:
        return registry.get_sample_value(
            f"taotrace_proxy_overhead_seconds_{suffix}",
            {"upstream": "127.0.0.1", "api": "chat_completions", "stage": stage},
        )

    assert sample("request", "count") == 1
    assert rec.timing.overhead_request is not None and sample("request", "sum") == rec.timing.overhead_request
    assert rec.timing.network is not None and rec.timing.overhead_request <= rec.timing.network
    assert sample("relay", "count") == len(rec.timing.relay) >= 5  # 9 frames, some may share a read
    assert isinstance(rec.timing.relay, tuple)  # one process: the values themselves
    assert 0 < sum(rec.timing.relay) < 0.05  # microseconds each; generous for a loaded machine


async def upstream_with_slow_head(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(0.1)  # the upstream's time to first byte
    resp = web.StreamResponse(headers={"Content-Type": "application/json", "Server-Timing": "db;dur=53"})
    await resp.prepare(request)
    await resp.write(b"{}")
    await resp.write_eof()
    return resp


async def test_server_timing_is_off_by_default(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    proxy.serve(upstream_with_slow_head)
    async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m"}) as r:
        await r.read()
    assert r.headers.getall("Server-Timing") == ["db;dur=53"]  # the upstream's head, untouched


async def test_server_timing_header_when_asked(start_proxy: ProxyFactory, client: aiohttp.ClientSession) -> None:
    async with start_proxy(server_timing=True) as p:
        p.serve(upstream_with_slow_head)
        async with client.post(p.url + "/v1/chat/completions", json={"model": "m"}) as r:
            assert await r.read() == b"{}"
        values = r.headers.getall("Server-Timing")
    assert values[0] == "db;dur=53"  # the upstream's own metrics stay, ours come beside them
    durations = {name: float(dur) for name, dur in re.findall(r"(\w+);dur=([0-9.]+)", values[1])}
    assert set(durations) == {"network", "proxy", "upstream"}
    assert durations["proxy"] <= durations["network"] < 100
    assert 90 <= durations["upstream"] < 2000  # written -> response head: the upstream's 100 ms
