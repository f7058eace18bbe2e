"""Run inside a network namespace by tests/test_tcp_network.py: a fake upstream that waits
`SERVER_WAIT` before its first token, the proxy in front of it, one stream; prints what the
proxy recorded as JSON. (A separate process: Python 3.11 cannot switch a thread's namespace.)"""

from __future__ import annotations

import asyncio
import json

import aiohttp
from prometheus_client import CollectorRegistry

from proxy.config.settings import Settings
from proxy.exchange.record import RequestRecord
from proxy.serve import running
from proxy.telemetry.tracing import Tracing
from tests.fakes import FakeUpstream, chat_stream, stream_handler

SERVER_WAIT = 0.2


async def main() -> None:
    upstream = await FakeUpstream(stream_handler(chat_stream(3), first_delay=SERVER_WAIT)).start()
    records: list[RequestRecord] = []
    settings = Settings(upstream=upstream.url, port=0, metrics_port=0)
    try:
        async with (
            running(settings, on_record=records.append, tracing=Tracing(), registry=CollectorRegistry()) as srv,
            aiohttp.ClientSession() as client,
        ):
            body = {"model": "m", "stream": True}
            async with client.post(srv.proxy_url + "/v1/chat/completions", json=body) as r:
                await r.read()
    finally:
        await upstream.close()
    rec = records[-1]
    assert rec.tcp is not None
    print(json.dumps({
        "rtt": rec.tcp.rtt, "min_rtt": rec.tcp.min_rtt, "prefill_wait": rec.timing.prefill_wait,
        "server_wait": rec.server_wait, "server_wait_true": SERVER_WAIT,
    }))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
