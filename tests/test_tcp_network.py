"""TCP_INFO of each request's upstream connection, end to end: spans, metrics, the server-wait
estimate, reuse, cuts, TLS, and an independent reader (`ss -ti`) of the same connection."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
from collections.abc import Callable

import aiohttp
import pytest
import trustme
from aiohttp import web
from prometheus_client import CollectorRegistry
from yarl import URL

from proxy.exchange.timing import PhaseClock
from proxy.upstream import UpstreamPool
from proxy.upstream.tcpinfo import NEW_CONNECTION
from tests.conftest import Proxied
from tests.fakes import chat_stream, json_handler, stream_handler
from tests.test_client_close import close_after

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO is read on Linux only")

CHAT = "/v1/chat/completions"


async def _stream(client: aiohttp.ClientSession, proxy: Proxied, model: str = "m") -> None:
    async with client.post(proxy.url + CHAT, json={"model": model, "stream": True}) as r:
        assert r.status == 200
        await r.read()


async def test_a_stream_carries_rtt_retransmits_and_server_wait(
    proxy: Proxied, client: aiohttp.ClientSession, registry: CollectorRegistry
) -> None:
    proxy.serve(stream_handler(chat_stream(3), first_delay=0.05))
    await _stream(client, proxy)
    rec = proxy.records[-1]
    assert rec.tcp is not None and rec.tcp.rtt is not None and rec.tcp.min_rtt is not None
    assert 0 < rec.tcp.min_rtt <= rec.tcp.rtt < 0.5  # loopback
    assert (rec.tcp.retransmits, rec.tcp.out_of_order) == (0, 0)
    prefill, server_wait = rec.timing.prefill_wait, rec.server_wait
    assert prefill is not None and server_wait is not None
    assert server_wait == pytest.approx(prefill - rec.tcp.min_rtt)
    a = proxy.spans("chat m")[-1].attributes
    assert a["taotrace.tcp.rtt"] == rec.tcp.rtt and a["taotrace.tcp.min_rtt"] == rec.tcp.min_rtt
    assert a["taotrace.tcp.rtt_var"] == rec.tcp.rtt_var and a["taotrace.tcp.retransmits"] == 0
    assert a["taotrace.tcp.out_of_order"] == 0 and a["taotrace.server_wait"] == server_wait
    assert a["taotrace.tcp.delivery_rate"] > 0
    labels = {"upstream": "127.0.0.1", "api": "chat_completions", "model": "m"}
    assert registry.get_sample_value("taotrace_upstream_rtt_seconds_count", labels) == 1
    assert registry.get_sample_value("taotrace_upstream_rtt_seconds_sum", labels) == rec.tcp.min_rtt
    assert registry.get_sample_value("taotrace_upstream_retransmits_total", labels) == 0


async def test_a_reused_connection_counts_from_its_previous_request(
    proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    proxy.serve(json_handler({"ok": True}))
    for _ in range(3):
        async with client.get(proxy.url + "/v1/models") as r:
            await r.read()
    reused = [rec.timing.connection_reused for rec in proxy.records]
    assert reused == [False, True, True]
    for rec in proxy.records:  # not a stream: RTT from the end reading, no server-wait estimate
        assert rec.tcp is not None and rec.tcp.rtt is not None and rec.tcp.retransmits == 0
        assert rec.server_wait is None
    root = proxy.spans("GET")[-1]
    assert "taotrace.tcp.rtt" in root.attributes and "taotrace.server_wait" not in root.attributes


async def test_a_cut_stream_keeps_its_reading(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    frames = chat_stream(4)

    async def cut(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame in frames[:3]:
            await resp.write(frame)
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()  # mid-body, without the terminating chunk
        return resp

    proxy.serve(cut)
    with pytest.raises(aiohttp.ClientPayloadError):
        async with client.post(proxy.url + CHAT, json={"model": "m", "stream": True}) as r:
            await r.read()
    await _until(lambda: len(proxy.records) == 1)
    rec = proxy.records[-1]
    assert rec.error_type == "stream_cut"
    # Read as the connection closed (the socket was gone by the time the request ended).
    assert rec.tcp is not None and rec.tcp.rtt is not None and rec.tcp.retransmits == 0


async def test_a_client_leaving_after_done_is_read_before_the_rest_is_discarded(
    proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    frames = chat_stream(3)
    proxy.serve(stream_handler(frames, gap=0.005, linger=0.04))  # the end of body comes 40 ms late
    await close_after(client, proxy.url + CHAT, frames[-1])
    await _until(lambda: len(proxy.records) == 1)
    await asyncio.sleep(0.1)  # the rest arrives; the connection goes back to the pool
    proxy.serve(stream_handler(frames))
    await _stream(client, proxy)
    first, second = proxy.records
    assert first.error_type == "" and second.timing.connection_reused
    for rec in (first, second):
        assert rec.tcp is not None and rec.tcp.rtt is not None and rec.tcp.retransmits == 0


async def _until(done: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not done():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_tls_upstream_reads_the_tcp_socket_underneath() -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream_handler(chat_stream(3), first_delay=0.02))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx).start()
    port = runner.addresses[0][1]
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)
    pool = UpstreamPool(
        URL(f"https://localhost:{port}"), connect_timeout=2, read_timeout=2, keepalive=1, ssl_context=trusted
    )
    try:
        resp = await pool.request("POST", CHAT, [], b"{}", PhaseClock(0.0))
        during = resp.tcp_info()

        async def drained() -> None:
            return None

        await resp.relay(lambda _chunk: False, drained)
        end = resp.end_tcp()
        resp.close()
    finally:
        await pool.close()
        await runner.cleanup()
    assert resp.tcp_start == NEW_CONNECTION
    assert during is not None and during.rtt is not None and during.rtt > 0
    assert end is not None and end.rtt is not None and end.total_retrans == 0


_SS_RTT = re.compile(r"\brtt:([\d.]+)/([\d.]+)")
_SS_MINRTT = re.compile(r"\bminrtt:([\d.]+)")


@pytest.mark.skipif(shutil.which("ss") is None, reason="ss (iproute2) is not installed: make system-deps")
async def test_rtt_agrees_with_ss_reading_the_same_connection(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    # A slow stream: one token, then 1 s of silence while `ss` reads the open upstream connection.
    frames = chat_stream(3)
    proxy.serve(stream_handler(frames, first_delay=0.02, gap=0.5))
    upstream_port = URL(proxy.upstream.url).port
    task = asyncio.ensure_future(_stream(client, proxy))
    await asyncio.sleep(0.3)
    ss = await asyncio.create_subprocess_exec(
        "ss", "-tin", "state", "established", f"( dport = :{upstream_port} )",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out = (await ss.communicate())[0].decode()
    await task
    rtt, minrtt = _SS_RTT.search(out), _SS_MINRTT.search(out)
    assert rtt is not None and minrtt is not None, out
    ss_rtt, ss_min = float(rtt.group(1)) / 1000, float(minrtt.group(1)) / 1000  # ss prints ms
    tcp = proxy.records[-1].tcp
    assert tcp is not None and tcp.rtt is not None and tcp.min_rtt is not None
    assert ss_rtt > 0 and tcp.rtt > 0
    # Same order of magnitude (ss prints ms with 3 decimals: 1 µs resolution).
    assert tcp.rtt / 10 <= ss_rtt + 1e-6 and ss_rtt <= tcp.rtt * 10 + 1e-6, (out, tcp)
    assert tcp.min_rtt / 10 <= ss_min + 1e-6 and ss_min <= tcp.min_rtt * 10 + 1e-6, (out, tcp)


NETEM_DELAY = 0.010  # on `lo` each packet is delayed once: a 20 ms round trip


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_netem_delay_shows_as_rtt_and_leaves_server_wait() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("needs root, ip and tc (iproute2) for a network namespace with netem")
    ns = f"taotrace-netem-{os.getpid()}"
    if _run("ip", "netns", "add", ns).returncode != 0:
        pytest.skip("cannot create a network namespace here")
    try:
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        netem = _run(
            "ip",
            "netns",
            "exec",
            ns,
            "tc",
            "qdisc",
            "add",
            "dev",
            "lo",
            "root",
            "netem",
            "delay",
            f"{NETEM_DELAY * 1000:g}ms",
        )
        if netem.returncode != 0:
            pytest.skip(f"this kernel has no sch_netem (tc: {netem.stderr.strip()})")
        done = _run("ip", "netns", "exec", ns, sys.executable, "-m", "tests.netns_rtt")
    finally:
        _run("ip", "netns", "del", ns)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["min_rtt"] == pytest.approx(2 * NETEM_DELAY, abs=0.005), got
    assert got["rtt"] >= got["min_rtt"]
    assert got["server_wait"] == pytest.approx(got["prefill_wait"] - got["min_rtt"])
    # The network's share is gone from the estimate: what is left is the upstream's own wait.
    assert got["server_wait_true"] - 0.005 <= got["server_wait"] <= got["server_wait_true"] + 0.1, got
