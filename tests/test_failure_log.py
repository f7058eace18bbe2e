"""Upstream and collector failures are logged at the default level: one WARNING line at once
naming the address (origin only) and the cause, then a count per interval; never a traceback, a
key, or the OpenTelemetry SDK's and urllib3's own lines."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from proxy.errors import UpstreamUnreachable
from proxy.logs.upstream_failures import head_cause
from tests.fakes import FakeUpstream, chat_stream, json_handler, stream_handler

ROOT = Path(__file__).resolve().parent.parent
CANARY_KEY = "sk-canary-key-7731"
CANARY_QUERY = "canary-query-7732"
CANARY_PASS = "canary-pass-7733"
CANARY_PROMPT = "canary-prompt-7734"
RAW_LINES = ("opentelemetry", "urllib3", "Transient error", "Failed to export", "Retrying", "Traceback")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "taotrace" and r.levelno == logging.WARNING]


async def post(client: aiohttp.ClientSession, url: str, stream: bool = False) -> int:
    async with client.post(
        url + f"/v1/chat/completions?key={CANARY_QUERY}",
        json={"model": "m", "stream": stream, "messages": [{"role": "user", "content": CANARY_PROMPT}]},
        headers={"Authorization": f"Bearer {CANARY_KEY}"},
    ) as r:
        await r.read()
        return r.status


# --- the proxy as a real process, at the default log level ---------------------------------------


@asynccontextmanager
async def serve(upstream: str, env: dict[str, str], tmp: Path) -> AsyncIterator[tuple[str, Path]]:
    """`python -m proxy serve` with stderr in a file; yields (proxy URL, stderr path); SIGTERM on exit."""
    stderr_path = tmp / "stderr.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TAOTRACE_"))}
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--port", "0", "--metrics-port", "0"],
            cwd=ROOT,
            env={**base, **env},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            url = ""
            deadline = time.monotonic() + 20
            while not url and time.monotonic() < deadline and proc.poll() is None:
                m = re.search(r"taotrace proxy on (http://\S+) ->", stderr_path.read_text())
                url = m.group(1) if m else ""
                await asyncio.sleep(0.05)
            assert url, stderr_path.read_text()
            yield url, stderr_path
            proc.send_signal(signal.SIGTERM)
            for _ in range(300):  # a dead collector's last flush is bounded at 2 s
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            assert proc.returncode == 0, stderr_path.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def lines_once(path: Path, pattern: str, timeout: float = 10.0) -> list[str]:
    """The stderr lines matching `pattern`, once there is one (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in path.read_text().splitlines() if re.search(pattern, line)]
        if found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


async def test_a_dead_upstream_is_one_warning_at_once_naming_it_and_the_cause(tmp_path: Path) -> None:
    port = closed_port()
    upstream = f"http://user:{CANARY_PASS}@127.0.0.1:{port}/api"
    async with serve(upstream, {}, tmp_path) as (url, stderr), aiohttp.ClientSession() as client:
        assert [await post(client, url) for _ in range(3)] == [502, 502, 502]
        first = await lines_once(stderr, "upstream ")
        await asyncio.sleep(0.2)  # nothing more comes for the other two
        during = stderr.read_text()
    expected = f"WARNING taotrace: upstream http://127.0.0.1:{port} failed: connection refused (answered 502)"
    assert len(first) == 1 and first[0].endswith(expected), during
    assert [line for line in during.splitlines() if "WARNING" in line] == first
    after = stderr.read_text()  # at exit, the two held back are counted
    assert re.search(re.escape(expected) + r" \(2 more in the last [\d.]+ s\)$", after, re.M), after
    for secret in (CANARY_KEY, CANARY_QUERY, CANARY_PASS, CANARY_PROMPT, "Traceback"):
        assert secret not in after, secret


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
async def test_a_dead_collector_is_one_line_of_ours_and_requests_are_unaffected(tmp_path: Path, protocol: str) -> None:
    port = closed_port()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {CANARY_KEY}",  # a collector's key
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_METRICS_EXPORTER": "otlp",  # both signals fail: still one line, they share the collector
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    fake = await FakeUpstream(stream_handler(chat_stream(5))).start()
    try:
        async with serve(fake.url, env, tmp_path) as (url, stderr), aiohttp.ClientSession() as client:
            for _ in range(5):
                async with client.post(url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                    assert r.status == 200 and await r.read() == b"".join(chat_stream(5))
            first = await lines_once(stderr, "OTLP export")
            await asyncio.sleep(1.0)  # retries and the metrics' exports fail meanwhile: held back
            assert [line for line in stderr.read_text().splitlines() if "OTLP export" in line] == first
    finally:
        await fake.close()
    text = stderr.read_text()
    expected = f"WARNING taotrace: OTLP export to http://127.0.0.1:{port} failed: connection refused;"
    assert len(first) == 1 and expected in first[0], text
    for raw in (*RAW_LINES, CANARY_KEY):
        assert raw not in text, (raw, text)


# --- each cause, in this process -------------------------------------------------------------------


async def _silent(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(30)
    raise AssertionError("unreachable")


async def _reset(request: web.Request) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.abort()  # RST before any response byte
    raise ConnectionResetError


async def _cut(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(chat_stream(3)[0])
    assert request.transport is not None
    request.transport.close()  # no terminating chunk
    return resp


async def _stall(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(chat_stream(3)[0])
    await asyncio.sleep(30)
    return resp


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("refused", "failed: connection refused (answered 502)"),
        ("dns", "failed: DNS lookup failed (answered 502)"),
        ("tls", "failed: TLS handshake failed (answered 502)"),
        ("connect_timeout", "failed: connect timeout (answered 504)"),
        ("silent", "failed: no response headers within the read timeout (answered 504)"),
        ("reset", "failed: closed the connection before responding (answered 502)"),
        ("cut", "failed mid-response: connection closed mid-response (the response was cut)"),
        ("stall", "failed mid-response: no data within the read timeout (the response was cut)"),
    ],
)
async def test_each_cause_is_named(
    case: str, expected: str, start_proxy, upstream, client, blackhole: int, caplog: pytest.LogCaptureFixture
) -> None:
    host = upstream.url.removeprefix("http://")
    target, settings = {
        "refused": (f"http://127.0.0.1:{closed_port()}", {}),
        "dns": ("http://no-such-host.invalid:8000", {}),
        "tls": (f"https://{host}", {}),  # a plain-HTTP server answering a TLS handshake
        "connect_timeout": (f"http://127.0.0.1:{blackhole}", {"connect_timeout": 0.3}),
        "silent": (upstream.url, {"read_timeout": 0.3}),
        "reset": (upstream.url, {}),
        "cut": (upstream.url, {}),
        "stall": (upstream.url, {"read_timeout": 0.3}),
    }[case]
    upstream.handler = {"silent": _silent, "reset": _reset, "cut": _cut, "stall": _stall}.get(case, upstream.handler)
    with caplog.at_level(logging.WARNING, logger="taotrace"):
        async with start_proxy(upstream=target, **settings) as p:
            try:
                await post(client, p.url, stream=case in ("cut", "stall"))
            except aiohttp.ClientPayloadError:
                assert case in ("cut", "stall")  # the cut reaches the client as a cut
    origin = target.split("//")[1]
    origin = f"{target.split('://')[0]}://{origin}" if ":" in origin else origin
    assert warnings_of(caplog) == [f"upstream {origin} {expected}"]
    assert all(r.exc_info is None for r in caplog.records if r.name.startswith("taotrace"))


async def test_answers_and_clients_leaving_are_not_upstream_failures(
    start_proxy, upstream, client, caplog: pytest.LogCaptureFixture
) -> None:
    upstream.handler = json_handler({"error": {"message": "boom"}}, status=500)
    with caplog.at_level(logging.WARNING, logger="taotrace"):
        async with start_proxy() as p:
            assert await post(client, p.url) == 500  # the upstream answered: metrics count it
            upstream.handler = stream_handler(chat_stream(50), gap=0.05)
            async with client.post(p.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                await r.content.readany()
                r.close()  # the client leaves mid-stream
            await asyncio.sleep(0.2)
    assert warnings_of(caplog) == []


def test_a_lookup_failure_without_an_os_error_is_still_dns() -> None:
    """No address at all (getaddrinfo returned nothing) raises ours with no OSError behind it."""
    assert head_cause(UpstreamUnreachable("cannot resolve upstream host example.test")) == "DNS lookup failed"
    try:
        try:
            raise ssl.SSLCertVerificationError(1, "certificate verify failed")
        except ssl.SSLError:
            raise UpstreamUnreachable("TLS handshake with upstream h:443 failed (SSLCertVerificationError)") from None
    except UpstreamUnreachable as exc:
        assert head_cause(exc) == "TLS certificate not trusted"


async def test_behind_routes_the_failing_upstream_is_the_one_named(
    start_proxy, upstream, client, caplog: pytest.LogCaptureFixture
) -> None:
    dead = closed_port()
    with caplog.at_level(logging.WARNING, logger="taotrace"):
        async with start_proxy(routes=[f"dead:/dead=http://127.0.0.1:{dead}/v1"]) as p:
            assert await post(client, p.url) == 200  # the route for / is alive
            assert await post(client, p.url + "/dead") == 502
    assert warnings_of(caplog) == [f"upstream http://127.0.0.1:{dead} failed: connection refused (answered 502)"]
