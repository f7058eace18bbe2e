"""The live view's JSON API and its guard, against the real proxy and a fake upstream on port 0."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.config.settings import Settings
from proxy.workers.supervisor import supervising
from tests.conftest import Proxied, ProxyFactory
from tests.fakes import FakeUpstream, Handler, chat_chunk, chat_stream, json_handler, sse, stream_handler, usage_chunk

SECRET_KEY = "sk-live-view-must-never-show-this"
COOKIE = "session=cookie-value-must-never-show"


async def _stream(client: aiohttp.ClientSession, p: Proxied, model: str = "gpt-4o-mini") -> None:
    async with client.post(
        p.url + "/v1/chat/completions",
        json={"model": model, "stream": True, "messages": [{"role": "user", "content": "the prompt text"}]},
        headers={"Authorization": f"Bearer {SECRET_KEY}", "Cookie": COOKIE},
    ) as response:
        await response.read()


async def _get(client: aiohttp.ClientSession, url: str, **kw: object) -> tuple[int, Any]:
    async with client.get(url, **kw) as response:  # type: ignore[arg-type]
        return response.status, json.loads(await response.read() or b"null")


async def test_requests_and_detail_show_the_same_record_as_the_spans(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy(trace_url="http://jaeger:16686/trace/{trace_id}") as p:
        p.serve(stream_handler(chat_stream(5), first_delay=0.05, gap=0.01))
        await _stream(client, p)
        p.serve(json_handler({"error": {"message": "no"}}, status=429))
        await _stream(client, p, model="<script>alert(1)</script>")
        status, body = await _get(client, p.metrics_url + "/api/requests")
        assert status == 200 and body["size"] == 2 and body["capacity"] == 1000
        newest, first = body["requests"]
        assert newest["model"] == "<script>alert(1)</script>" and newest["error_type"] == "rate_limited"
        rec = p.records[0]
        assert first["trace_id"] == rec.trace_id
        assert (first["ttft"], first["tpot"], first["network"], first["decode"], first["output_tokens"]) == (
            rec.timing.ttft, rec.timing.tpot, rec.timing.network, rec.timing.decode, 5,
        )  # fmt: skip
        status, one = await _get(client, f"{p.metrics_url}/api/requests/{rec.trace_id}")
        assert status == 200 and one["trace_url"] == f"http://jaeger:16686/trace/{rec.trace_id}"
        spans = {s.name: s for s in p.spans() if format(s.context.trace_id, "032x") == rec.trace_id}
        for name in ("network", "prefill_wait", "decode"):
            shown = next(s for s in one["spans"] if s["name"] == name)
            exported = (spans[name].end_time - spans[name].start_time) / 1e9
            assert shown["end"] - shown["start"] == pytest.approx(exported, abs=2e-6), name
        assert len(one["gaps"]["values"]) == 4 and one["record"]["usage"]["output_tokens"] == 5
        status, _ = await _get(client, p.metrics_url + "/api/requests?errors=1&since=1")
        assert status == 200
        status, only = await _get(client, p.metrics_url + "/api/requests?errors=true")
        assert [r["error_type"] for r in only["requests"]] == ["rate_limited"]


async def test_nothing_secret_or_prompt_reaches_the_api(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy() as p:
        p.serve(stream_handler(chat_stream(3)))
        await _stream(client, p)
        pages = [p.metrics_url + "/api/requests", p.metrics_url + "/api/summary"]
        pages.append(f"{p.metrics_url}/api/requests/{p.records[0].trace_id}")
        for url in pages:
            async with client.get(url) as response:
                text = await response.text()
            assert response.status == 200
            for secret in (SECRET_KEY, "cookie-value", "the prompt text", "tok0"):
                assert secret not in text, (url, secret)


async def test_bad_parameters_get_400_and_unknown_ids_404(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    status, body = await _get(client, proxy.metrics_url + "/api/requests?limit=abc")
    assert status == 400 and body["error"]["message"] == "taotrace: limit must be a number, got 'abc'"
    status, body = await _get(client, proxy.metrics_url + "/api/requests?limit=5000")
    assert status == 400 and "between 1 and 1000" in body["error"]["message"]
    status, body = await _get(client, proxy.metrics_url + "/api/requests/" + "0" * 32)
    assert status == 404 and body["error"]["type"] == "not_found"


async def test_page_and_files_are_served_with_a_strict_policy(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    async with client.get(proxy.metrics_url + "/") as response:
        page = await response.text()
        assert response.status == 200 and response.content_type == "text/html"
        assert "script-src" not in response.headers["Content-Security-Policy"]  # default-src 'self' covers it
        assert response.headers["Content-Security-Policy"].startswith("default-src 'self'")
    assert '<script type="module" src="/ui/app.js">' in page
    for name, ctype in (("app.js", "text/javascript"), ("charts.js", "text/javascript"), ("style.css", "text/css")):
        async with client.get(f"{proxy.metrics_url}/ui/{name}") as response:
            assert response.status == 200 and response.content_type == ctype
    for name in ("../settings.py", "%2e%2e%2fsettings.py", "index.htm"):
        async with client.get(f"{proxy.metrics_url}/ui/{name}") as response:
            assert response.status == 404, name


async def test_the_token_guards_the_view_but_never_metrics_or_probes(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy(ui_token="s3cret") as p:
        base = p.metrics_url
        for path in ("/", "/ui/app.js", "/api/requests", "/api/summary", "/api/requests/1"):
            async with client.get(base + path) as response:
                assert response.status == 401, path
                assert response.headers["WWW-Authenticate"] == "Bearer"
                assert "s3cret" not in await response.text()
        for path in ("/metrics", "/healthz", "/readyz"):
            async with client.get(base + path) as response:
                assert response.status == 200, path
        status, _ = await _get(client, base + "/api/summary", headers={"Authorization": "Bearer wrong"})
        assert status == 401
        status, _ = await _get(client, base + "/api/summary", headers={"Authorization": "Bearer s3cret"})
        assert status == 200
        async with client.get(base + "/?token=wrong", allow_redirects=False) as response:
            assert response.status == 401
        # Opening /?token= once trades the token for an HttpOnly cookie and drops it from the address.
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            async with browser.get(base + "/?token=s3cret", allow_redirects=False) as response:
                assert response.status == 303 and response.headers["Location"] == "/"
                cookie = response.cookies["taotrace_ui"]
                assert cookie.value == "s3cret" and cookie["httponly"] and cookie["samesite"] == "Strict"
            async with browser.get(base + "/api/summary") as response:
                assert response.status == 200


async def test_no_ui_leaves_the_metrics_port_as_it_was(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy(ui=False) as p:
        assert p.srv.live is None
        for path in ("/", "/api/requests", "/api/summary"):
            async with client.get(p.metrics_url + path) as response:
                assert response.status == 404, path
        async with client.get(p.metrics_url + "/metrics") as response:
            assert response.status == 200


async def test_the_ring_is_bounded_by_ui_requests(start_proxy: ProxyFactory, client: aiohttp.ClientSession) -> None:
    async with start_proxy(ui_requests=3) as p:
        for _ in range(5):
            async with client.get(p.url + "/v1/models") as response:
                await response.read()
        status, body = await _get(client, p.metrics_url + "/api/requests")
        assert status == 200 and body["size"] == 3 and [r["seq"] for r in body["requests"]] == [5, 4, 3]
        status, body = await _get(client, p.metrics_url + "/api/summary")
        assert body["requests"] == 5 and body["in_flight"] == 0 and body["experiments"] is None


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"trace_url": "javascript:alert(1)//{trace_id}"}, "http"),
        ({"trace_url": "http://jaeger/trace/"}, "{trace_id}"),
        ({"ui_requests": 0}, "greater than or equal to 1"),
    ],
)
def test_settings_refuse_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**kwargs)  # type: ignore[arg-type]


def test_ui_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAOTRACE_UI_TOKEN", "tkn-9f2c")
    monkeypatch.setenv("TAOTRACE_UI_REQUESTS", "50")
    monkeypatch.setenv("TAOTRACE_TRACE_URL", "http://localhost:16686/trace/{trace_id}")
    s = Settings()
    assert s.ui_token is not None and s.ui_token.get_secret_value() == "tkn-9f2c" and "tkn-9f2c" not in repr(s)
    assert (s.ui, s.ui_requests, s.trace_url) == (True, 50, "http://localhost:16686/trace/{trace_id}")
    monkeypatch.setenv("TAOTRACE_UI_TOKEN", "")
    assert Settings().ui_token is None


@pytest.mark.skipif(sys.platform != "linux", reason="--workers needs SO_REUSEPORT (Linux)")
async def test_with_workers_the_supervisor_shows_every_workers_requests(
    upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    upstream.handler = stream_handler(chat_stream(3))
    settings = Settings(upstream=upstream.url, port=0, metrics_port=0, drain_seconds=1.0, workers=2)
    async with supervising(settings) as group:
        for _ in range(6):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                async with fresh.post(
                    group.proxy_url + "/v1/chat/completions", json={"model": "m", "stream": True}
                ) as r:
                    await r.read()
        deadline = time.monotonic() + 10
        while True:  # records reach the supervisor in batches
            status, body = await _get(client, group.metrics_url + "/api/requests")
            if body["size"] == 6 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert status == 200 and body["size"] == 6 and {r["output_tokens"] for r in body["requests"]} == {3}
        status, summary = await _get(client, group.metrics_url + "/api/summary")
        assert summary["requests"] == 6 and summary["in_flight"] == 0


def _held_stream(head: asyncio.Event, first: asyncio.Event, rest: asyncio.Event) -> Handler:
    """A stream that advances only when the test says: its head, one token, then the rest."""
    frames = chat_stream(4)

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        await head.wait()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await first.wait()
        for frame in frames[:2]:  # the role-only chunk, then one token
            await response.write(frame)
        await rest.wait()
        for frame in frames[2:]:
            await response.write(frame)
        await response.write_eof()
        return response

    return handler


async def _running_until(
    client: aiohttp.ClientSession, url: str, ok: Callable[[list[dict[str, Any]]], bool]
) -> dict[str, Any]:
    deadline = time.monotonic() + 15
    while True:
        status, body = await _get(client, url + "/api/requests")
        assert status == 200
        if ok(body["in_flight"]):
            return dict(body)
        assert time.monotonic() < deadline, body["in_flight"]
        await asyncio.sleep(0.05)


@pytest.mark.skipif(sys.platform != "linux", reason="--workers needs SO_REUSEPORT (Linux)")
@pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)
async def test_a_running_request_shows_its_phase_then_becomes_a_finished_row(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    head, first, rest = asyncio.Event(), asyncio.Event(), asyncio.Event()
    async with start_proxy() as p:
        p.serve(_held_stream(head, first, rest))
        url = p.metrics_url

        async def call() -> bytes:
            async with client.post(
                p.url + "/v1/chat/completions",
                json={"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "the prompt text"}]},
                headers={"Authorization": f"Bearer {SECRET_KEY}"},
            ) as response:
                return await response.read()

        calling = asyncio.ensure_future(call())
        try:
            body = await _running_until(client, url, lambda rows: [r["phase"] for r in rows] == ["headers"])
            row = body["in_flight"][0]
            assert (row["api"], row["model"], row["stream"], row["status"], row["in_flight"]) == (
                "chat_completions", "gpt-4o", True, None, True,
            )  # fmt: skip
            assert row["elapsed"] > 0 and row["network"] is not None and row["ttft"] is None
            assert body["requests"] == [] and body["size"] == 0  # nothing has finished
            assert abs(row["started"] - time.time()) < 30
            head.set()
            body = await _running_until(client, url, lambda rows: [r["phase"] for r in rows] == ["prefill_wait"])
            assert body["in_flight"][0]["status"] == 200 and body["in_flight"][0]["id"] == row["id"]
            first.set()
            body = await _running_until(client, url, lambda rows: [r["phase"] for r in rows] == ["decode"])
            running = body["in_flight"][0]
            assert running["output_tokens"] == 1 and running["ttft"] is not None
            assert running["elapsed"] >= running["ttft"] >= running["network"]
            # Its waterfall so far: the phases up to now, in the shape of a finished one.
            status, one = await _get(client, f"{url}/api/requests/{row['id']}")
            assert status == 200 and one["in_flight"] is True
            spans = {s["name"]: s for s in one["spans"]}
            assert set(spans) == {"chat gpt-4o", "network", "prefill_wait", "decode"}
            assert spans["prefill_wait"]["end"] == spans["decode"]["start"] == running["ttft"]
            assert one["marks"]["ttft"] == running["ttft"] and one["gaps"]["count"] == 0
            # The filters apply to it as to the finished rows.
            for query, shown in (("api=chat_completions", 1), ("api=messages", 0), ("errors=1", 0), ("slow=3600", 0)):
                status, some = await _get(client, f"{url}/api/requests?{query}")
                assert status == 200 and len(some["in_flight"]) == shown, query
            text = json.dumps(await _get(client, url + "/api/requests"))
            assert SECRET_KEY not in text and "the prompt text" not in text
        finally:
            for event in (head, first, rest):
                event.set()
            await calling
        body = await _running_until(client, url, lambda rows: rows == [])
        deadline = time.monotonic() + 10
        while not body["requests"]:  # a worker's record reaches the supervisor a moment later
            assert time.monotonic() < deadline, (body, p.records)
            await asyncio.sleep(0.05)
            _, body = await _get(client, url + "/api/requests")
        (done,) = body["requests"]
        assert done["id"] == row["id"] and done["output_tokens"] == 4 and done["error_type"] == ""


async def test_a_request_without_a_model_is_unknown_in_the_api_as_in_the_metrics(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """Rows, details, filters, the summary and a running request all name it `unknown`, the
    metrics' label, never `null`."""
    head, first, rest = asyncio.Event(), asyncio.Event(), asyncio.Event()
    async with start_proxy() as p:
        url = p.metrics_url
        async with client.get(p.url + "/v1/models") as response:  # `other`: no model read
            await response.read()
        p.serve(stream_handler(chat_stream(2)))
        async with client.post(p.url + "/v1/chat/completions", json={"stream": True}) as response:  # no model
            await response.read()
        await _stream(client, p, model="gpt-4o")
        status, body = await _get(client, url + "/api/requests")
        assert status == 200 and [r["model"] for r in body["requests"]] == ["gpt-4o", "unknown", "unknown"]
        assert body["models"] == ["gpt-4o", "unknown"]  # the page's filter menu offers it
        status, only = await _get(client, url + "/api/requests?model=unknown")
        assert [r["api"] for r in only["requests"]] == ["chat_completions", "other"]
        for r in only["requests"]:
            status, one = await _get(client, f"{url}/api/requests/{r['id']}")
            assert status == 200 and one["record"]["model"] == "unknown"
        status, summary = await _get(client, url + "/api/summary")
        assert summary["models"]["unknown"]["requests"] == 2
        async with client.get(url + "/metrics") as response:
            metrics = await response.text()
        assert 'api="chat_completions",model="unknown"' in metrics and 'api="other",model="unknown"' in metrics

        p.serve(_held_stream(head, first, rest))

        async def call() -> bytes:
            async with client.post(p.url + "/v1/chat/completions", json={"stream": True}) as response:
                return await response.read()

        calling = asyncio.ensure_future(call())
        try:
            body = await _running_until(client, url, lambda rows: len(rows) == 1)
            assert body["in_flight"][0]["model"] == "unknown"
            status, one = await _get(client, f"{url}/api/requests/{body['in_flight'][0]['id']}")
            assert status == 200 and one["in_flight"] is True and one["record"]["model"] == "unknown"
            for query, shown in (("model=unknown", 1), ("model=gpt-4o", 0)):
                status, some = await _get(client, f"{url}/api/requests?{query}")
                assert status == 200 and len(some["in_flight"]) == shown, query
        finally:
            for event in (head, first, rest):
                event.set()
            await calling


async def test_a_browser_without_the_token_gets_a_page_saying_how_to_log_in(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    browser = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
    async with start_proxy(ui_token="s3cret") as p:
        for path, problem in (("/", False), ("/?token=wrong", True), ("/ui/style.css", False)):
            async with client.get(p.metrics_url + path, headers=browser, allow_redirects=False) as response:
                page = await response.text()
                assert response.status == 401 and response.content_type == "text/html", path
                assert "/?token=" in page and "Authorization: Bearer" in page and "TAOTRACE_UI_TOKEN" in page
                assert ("not this proxy's token" in page) is problem
                assert "s3cret" not in page and "wrong" not in page  # neither the token nor what was tried
                policy = response.headers["Content-Security-Policy"]
                assert "default-src 'none'" in policy and "script-src" not in policy  # no script can run there
        # Scripts and the API keep the JSON answer, whatever a browser-like Accept says.
        for path, headers in (("/api/summary", browser), ("/", {"Accept": "application/json"}), ("/", {})):
            status, body = await _get(client, p.metrics_url + path, headers=headers)
            assert status == 401 and body["error"]["type"] == "unauthorized", (path, headers)


async def test_an_api_request_sent_to_the_metrics_port_is_told_where_to_go(
    proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    """An SDK pointed at the metrics port by mistake gets a JSON error it shows, not a bare 404."""
    async with client.post(proxy.metrics_url + "/v1/chat/completions", json={"model": "m"}) as response:
        body = await response.json()
    assert response.status == 404 and body["error"]["type"] == "not_found"
    assert "metrics and live view port" in body["error"]["message"]
    assert "proxy's port" in body["error"]["message"]


async def test_the_metrics_port_still_answers_a_wrong_method_with_405(
    proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    for method, path in (("POST", "/metrics"), ("DELETE", "/healthz"), ("POST", "/api/summary")):
        async with client.request(method, proxy.metrics_url + path) as response:
            assert response.status == 405 and "GET" in response.headers["Allow"], (method, path)
    async with client.get(proxy.metrics_url + "/ui/nothing.js") as response:
        assert response.status == 404 and "proxy's port" not in await response.text()  # the view's own 404


def _reasoning_frames(hidden: bool) -> list[bytes]:
    """A reasoning model's stream: three streamed thoughts then the answer, or (hidden) the answer
    alone with 30 reasoning tokens reported."""
    frames = sse(chat_chunk(role="assistant", content=""), done=False)
    if not hidden:
        frames += sse(*[chat_chunk(reasoning_content=f"r{i}") for i in range(3)], done=False)
    frames += sse(*[chat_chunk(f"a{i}") for i in range(4)], done=False)
    return frames + sse(
        chat_chunk(finish="stop"), usage_chunk(5, 4 + (30 if hidden else 3), reasoning=30 if hidden else 3)
    )


@pytest.mark.parametrize("hidden", [False, True], ids=["streamed", "hidden"])
async def test_a_reasoning_model_s_thinking_in_the_waterfall(
    hidden: bool, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy() as p:
        p.serve(stream_handler(_reasoning_frames(hidden), first_delay=0.05, gap=0.02))
        await _stream(client, p, model="o3-mini")
        rec = p.records[-1]
        t = rec.timing
        status, body = await _get(client, p.metrics_url + "/api/requests")
        row = body["requests"][0]
        assert (row["ttft"], row["time_to_first_answer_token"]) == (t.ttft, t.time_to_first_answer_token)
        assert (row["thinking"], row["thinking_estimated"]) == (t.thinking, t.thinking_estimated)
        status, one = await _get(client, f"{p.metrics_url}/api/requests/{rec.trace_id}")
        names = [s["name"] for s in one["spans"][1:]]
        exported = {s.context.span_id: s for s in p.spans() if format(s.context.trace_id, "032x") == rec.trace_id}
        (thinking,) = [s for s in exported.values() if s.name == "thinking"]
        (shown,) = [s for s in one["spans"] if s["name"] == "thinking"]
        assert shown["end"] - shown["start"] == pytest.approx((thinking.end_time - thinking.start_time) / 1e9, abs=2e-6)
        assert shown["parent"] == exported[thinking.parent.span_id].name  # drawn inside the phase it belongs to
        assert shown["attributes"] == dict(thinking.attributes)
        assert "first_answer_token" not in one["record"]["timing"]  # an instant: shown as the spans' offsets
        if hidden:  # an estimate, a split of prefill_wait, drawn as one
            assert names == ["network", "prefill_wait", "thinking", "decode"]
            assert shown["estimated"] is True and shown["parent"] == "prefill_wait" and shown["end"] == t.ttft
            assert one["record"]["timing"]["thinking_estimated"] == t.thinking_estimated
            assert one["marks"]["first_answer"] == t.ttft
        else:
            assert names == ["network", "prefill_wait", "decode", "thinking"]
            assert shown["estimated"] is False and shown["parent"] == "decode"
            assert shown["start"] == pytest.approx(t.ttft) and shown["end"] == pytest.approx(
                t.time_to_first_answer_token
            )
            assert one["marks"]["first_answer"] == t.time_to_first_answer_token > t.ttft  # type: ignore[operator]


async def test_a_running_request_thinking_shows_the_phase(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """While a reasoning model streams its thoughts the request is `thinking`; its answer's first
    token turns it to decode, its thinking span ending there."""
    frames = _reasoning_frames(hidden=False)
    answer = asyncio.Event()
    done = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for frame in frames[:4]:  # the role chunk and the three thoughts
            await response.write(frame)
        await answer.wait()
        await response.write(frames[4])
        await done.wait()
        for frame in frames[5:]:
            await response.write(frame)
        await response.write_eof()
        return response

    async with start_proxy() as p:
        p.serve(handler)
        calling = asyncio.ensure_future(_stream(client, p, model="o3-mini"))
        try:
            url = p.metrics_url
            body = await _running_until(client, url, lambda rows: [r["phase"] for r in rows] == ["thinking"])
            row = body["in_flight"][0]
            assert row["first_answer"] is None and row["output_tokens"] == 3
            status, one = await _get(client, f"{url}/api/requests/{row['id']}")
            (thinking,) = [s for s in one["spans"] if s["name"] == "thinking"]
            assert thinking["start"] == row["ttft"] and thinking["parent"] == "decode"
            answer.set()
            body = await _running_until(client, url, lambda rows: [r["phase"] for r in rows] == ["decode"])
            row = body["in_flight"][0]
            assert row["first_answer"] > row["ttft"]
            status, one = await _get(client, f"{url}/api/requests/{row['id']}")
            (thinking,) = [s for s in one["spans"] if s["name"] == "thinking"]
            assert (thinking["start"], thinking["end"]) == (row["ttft"], row["first_answer"])
            assert one["marks"]["first_answer"] == row["first_answer"]
        finally:
            answer.set()
            done.set()
            await calling
