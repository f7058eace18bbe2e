"""Secret canaries: keys, cookies, `?key=` and prompt text sent through every kind of request,
success and failure; none may appear in exported spans (real OTLP payloads), DEBUG logs
(aiohttp's loggers included), /metrics, or any error body the proxy writes itself."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from tests.adversarial.faultproxy import blackhole
from tests.adversarial.proc import OtlpSink, ProxyProcess
from tests.adversarial.util import raw_request
from tests.fakes import chat_stream, named, sse

CANARIES = {
    "authorization": "sk-canary-auth-0001",
    "x-api-key": "canary-xapikey-0002",
    "api-key": "canary-apikey-0003",
    "cookie": "canary-cookie-0004",
    "query": "canary-query-0005",
    "prompt": "canary-prompt-0006",
}
HEADERS = {
    "Authorization": f"Bearer {CANARIES['authorization']}",
    "x-api-key": CANARIES["x-api-key"],
    "api-key": CANARIES["api-key"],
    "Cookie": f"session={CANARIES['cookie']}; other=1",
    "Content-Type": "application/json",
}
QUERY = f"?key={CANARIES['query']}&api-version=2024-10-21"


def body(stream: bool = True, model: str = "gpt-4o-mini") -> bytes:
    return json.dumps(
        {"model": model, "stream": stream, "messages": [{"role": "user", "content": f"say {CANARIES['prompt']}"}]}
    ).encode()


def scenario_upstream() -> web.Application:
    """Answers by the X-Scenario header; some answers echo the key back, as real APIs do."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        kind = request.headers.get("X-Scenario", "ok-stream")
        if kind == "ok-json":
            return web.json_response(
                {
                    "id": "c1",
                    "model": "gpt-4o-mini",
                    "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
                }
            )
        if kind == "401":
            return web.json_response(
                {
                    "error": {
                        "message": f"Incorrect API key provided: {CANARIES['authorization']}",
                        "type": "invalid_request_error",
                    }
                },
                status=401,
            )
        if kind == "500-echo":
            return web.Response(
                status=500, text=f"internal: query was key={CANARIES['query']} prompt {CANARIES['prompt']}"
            )
        if kind == "garbage":
            assert request.transport is not None
            request.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy")
            await asyncio.sleep(0.1)
            if request.transport is not None:
                request.transport.close()
            return web.Response()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if kind == "messages":
            await resp.write(
                named(
                    "message_start",
                    {"type": "message_start", "message": {"id": "m1", "model": "claude", "usage": {"input_tokens": 3}}},
                )
            )
            await resp.write(
                named(
                    "content_block_delta",
                    {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "ok"}},
                )
            )
            await resp.write(
                named(
                    "error",
                    {"type": "error", "error": {"type": "overloaded_error", "message": f"key {CANARIES['x-api-key']}"}},
                )
            )
            return resp
        frames = chat_stream(5)
        if kind == "mid-stream-error":
            frames = [frames[1], *sse({"error": {"message": f"bad key {CANARIES['authorization']}"}}, done=False)]
        for frame in frames:
            await resp.write(frame)
            await asyncio.sleep(0.005)
            if kind == "cut":
                assert request.transport is not None
                request.transport.abort()
                return resp
            if kind in ("stall", "abort"):
                await asyncio.sleep(30)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


async def _request(
    session: aiohttp.ClientSession, url: str, scenario: str, path: str = "/v1/chat/completions", **kw
) -> tuple[int, bytes]:
    headers = {**HEADERS, "X-Scenario": scenario}
    try:
        async with session.post(url + path + QUERY, data=kw.get("data", body()), headers=headers) as resp:
            if scenario == "abort":
                await resp.content.readany()
                return resp.status, b""
            return resp.status, await resp.read()
    except aiohttp.ClientPayloadError:
        return -1, b""


def _malformed() -> dict[str, bytes]:
    auth = f"Authorization: Bearer {CANARIES['authorization']}".encode()
    q = f"/v1/chat/completions?key={CANARIES['query']}".encode()
    return {
        "nul": b"POST " + q + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"\x00\r\nContent-Length: 2\r\n\r\n{}",
        "cl-te": b"POST "
        + q
        + b" HTTP/1.1\r\nHost: x\r\n"
        + auth
        + b"\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "long-auth": b"POST "
        + q
        + b" HTTP/1.1\r\nHost: x\r\n"
        + auth
        + b"A" * 20000
        + b"\r\nContent-Length: 2\r\n\r\n{}",
        "long-target": b"GET " + q + b"B" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        "bad-cookie": b"GET "
        + q
        + b" HTTP/1.1\r\nHost: x\r\nCookie: s="
        + CANARIES["cookie"].encode()
        + b"\x7f\x01\r\n\r\n",
        "bad-method": b"P\x01ST " + q + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n\r\n",
    }


def _leaks(text: bytes) -> list[str]:
    return [name for name, value in CANARIES.items() if value.encode() in text]


@pytest.mark.timeout(120)
async def test_no_canary_leaks_anywhere() -> None:
    sink = await OtlpSink("ok").start()
    up_runner = web.AppRunner(scenario_upstream(), access_log=None, shutdown_timeout=0.1)
    await up_runner.setup()
    await web.TCPSite(up_runner, "127.0.0.1", 0).start()
    upstream = "http://127.0.0.1:%d" % up_runner.addresses[0][1]
    env = sink.env()
    common = ("--log-level", "debug", "--access-log", "--drain-seconds", "1")
    # Attribution on, with the key's fingerprint as a metric label: the id may appear, the key never.
    attribution = (
        "--attribute-header",
        "x-scenario=app.scenario",
        "--attribute-body-user",
        "--metric-label",
        "taotrace.key.id",
    )
    main = ProxyProcess(
        "--upstream", upstream, "--read-timeout", "1", "--max-body-bytes", "4096", *common, *attribution, env=env
    )
    dead = ProxyProcess("--upstream", "http://127.0.0.1:9", *common, env=env)  # port 9: nothing listens
    proxy_bodies: list[tuple[str, bytes]] = []  # error bodies the proxy itself produced
    try:
        with blackhole() as hole:
            slow = ProxyProcess("--upstream", hole, "--connect-timeout", "0.5", *common, env=env)
            try:
                await asyncio.gather(main.started(), dead.started(), slow.started())
                async with aiohttp.ClientSession() as s:
                    for scenario in (
                        "ok-stream",
                        "ok-json",
                        "401",
                        "500-echo",
                        "cut",
                        "stall",
                        "abort",
                        "mid-stream-error",
                        "garbage",
                    ):
                        status, out = await _request(s, main.url, scenario)
                        if scenario in ("garbage",):
                            proxy_bodies.append((scenario, out))
                    await _request(s, main.url, "messages", path="/v1/messages")
                    await _request(s, main.url, "ok-stream", path="/v1/responses")
                    await _request(s, main.url, "ok-json", path="/v1/models")
                    status, out = await _request(s, main.url, "ok-stream", data=body() + b" " * 5000)
                    assert status == 413
                    proxy_bodies.append(("too-large", out))
                    for proc in (dead, slow):
                        status, out = await _request(s, proc.url, "ok-stream")
                        assert status in (502, 504)
                        proxy_bodies.append((f"unreachable-{status}", out))
                    await _request(s, main.url, "ok-stream")  # the traceparent-free baseline, once more
                    for name, data in _malformed().items():
                        out = await raw_request(main.url, data, timeout=2)
                        assert out.startswith(b"HTTP/1."), name
                        proxy_bodies.append((name, out))
                    scraped = b""
                    for accept in ("text/plain", "application/openmetrics-text"):
                        for proc in (main, dead, slow):
                            async with s.get(proc.metrics_url + "/metrics", headers={"Accept": accept}) as resp:
                                scraped += await resp.read()
                for proc in (main, dead, slow):
                    proc.terminate()
                for proc in (main, dead, slow):
                    await proc.exited(10)
                logs = {name: p.stderr() for name, p in (("main", main), ("dead", dead), ("slow", slow))}
            finally:
                slow.close()
    finally:
        main.close()
        dead.close()
        await sink.close()
        await up_runner.cleanup()

    spans = sink.spans()
    assert len(spans) > 30, "the sink should have received the spans of every request"
    assert {"network", "prefill_wait", "decode"} <= {s.name for s in spans}
    assert any(s.name == "chat gpt-4o-mini" for s in spans)
    for name, text in logs.items():
        assert "DEBUG" in text and "taotrace proxy on" in text  # debug logging really was on
        assert _leaks(text.encode()) == [], (name, _leaks(text.encode()))
    assert "GET /v1/models 200" in logs["main"] or "POST /v1/models 200" in logs["main"]  # the access log ran
    assert _leaks(b"".join(sink.bodies)) == []
    key_ids = {a.value.string_value for s in spans for a in s.attributes if a.key == "taotrace.key.id"}
    # One key, three processes, three random per-process salts: three fingerprints.
    assert len(key_ids) == 3 and all(len(k) == 12 for k in key_ids)
    assert any(a.key == "app.scenario" for s in spans for a in s.attributes)
    for span in spans:  # decoded, in case a value were ever compressed or escaped
        values = [span.name] + [str(a.value) for a in span.attributes] + [str(e) for e in span.events]
        assert _leaks("\n".join(values).encode()) == [], span.name
    assert b"taotrace_requests_total" in scraped and _leaks(scraped) == []
    assert b"taotrace_attributed_requests_total{" in scraped
    assert sum(k.encode() in scraped for k in key_ids) == 1  # main's, as its metric label
    for name, out in proxy_bodies:
        assert _leaks(out) == [], (name, out[:300])


async def test_an_unhandled_error_answers_500_without_its_message(upstream, caplog) -> None:
    """A bug of ours (here: a metric family whose rendering raises with a secret in its message)
    gives a plain 500; the log keeps the stack but never the exception's text."""
    import logging

    from proxy.config.settings import Settings
    from proxy.serve import running
    from proxy.telemetry.exposition import Counter
    from proxy.telemetry.tracing import Tracing

    class Broken(Counter):
        def render_group(self, children: list[object], openmetrics: bool) -> bytes:
            raise RuntimeError(f"boom {CANARIES['authorization']}")

    settings = Settings(upstream=upstream.url, port=0, metrics_port=0, drain_seconds=1.0)
    caplog.set_level(logging.DEBUG)
    async with running(settings, tracing=Tracing()) as srv:
        Broken("taotrace_broken", "Raises.", registry=srv.metrics.registry).labels().inc()
        async with aiohttp.ClientSession() as s, s.get(srv.metrics_url + "/metrics") as resp:
            status, text = resp.status, await resp.read()
    assert status == 500
    assert _leaks(text) == []
    assert "RuntimeError" in caplog.text and "render_group" in caplog.text  # the stack is kept
    assert _leaks(caplog.text.encode()) == []
