"""The rate-limit header parser (pure), and the span attributes and gauges it feeds."""

from __future__ import annotations

from datetime import datetime, timezone

import aiohttp
import pytest

from proxy.accounting.ratelimits import RateLimit, RateLimits, parse_reset, read_rate_limits
from tests.conftest import ProxyFactory
from tests.fakes import chat_stream, json_handler, stream_handler

NOW = datetime(2026, 12, 3, 9, 0, 0, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize(
    "value,seconds",
    [
        ("6m0s", 360.0),
        ("1s", 1.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0.5", 0.5),
        ("30", 30.0),
        ("2026-12-03T09:00:30Z", 30.0),
        ("2026-12-03T10:00:30+01:00", 30.0),
        ("2026-12-03T08:59:00Z", 0.0),  # already passed
        ("Thu, 03 Dec 2026 09:01:00 GMT", 60.0),
    ],
)
def test_resets_parse_in_every_format_seen(value: str, seconds: float) -> None:
    assert parse_reset(value, NOW) == pytest.approx(seconds, abs=1e-9)


@pytest.mark.parametrize("value", ["", "soon", "-1", "5x", "1s2", "nan", "inf", "9" * 80, "2026-13-45T00:00:00Z"])
def test_what_does_not_parse_is_left_out(value: str) -> None:
    assert parse_reset(value, NOW) is None


def test_openai_headers() -> None:
    headers = [
        ("x-ratelimit-limit-requests", "10000"),
        ("x-ratelimit-limit-tokens", "2000000"),
        ("x-ratelimit-remaining-requests", "9999"),
        ("x-ratelimit-remaining-tokens", "1999000"),
        ("x-ratelimit-reset-requests", "6ms"),
        ("x-ratelimit-reset-tokens", "6m0s"),
        ("content-type", "application/json"),
    ]
    got = read_rate_limits(headers, NOW)
    assert got is not None and got.retry_after is None and got.observed_at == NOW
    assert got.limits == (
        RateLimit(kind="requests", limit=10000, remaining=9999, reset=0.006),
        RateLimit(kind="tokens", limit=2000000, remaining=1999000, reset=360.0),
    )
    assert got.attributes() == {
        "taotrace.ratelimit.requests.limit": 10000,
        "taotrace.ratelimit.requests.remaining": 9999,
        "taotrace.ratelimit.requests.reset": 0.006,
        "taotrace.ratelimit.tokens.limit": 2000000,
        "taotrace.ratelimit.tokens.remaining": 1999000,
        "taotrace.ratelimit.tokens.reset": 360.0,
    }


def test_anthropic_headers_and_retry_after() -> None:
    headers = [
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "0"),
        ("anthropic-ratelimit-requests-reset", "2026-12-03T09:00:20Z"),
        ("anthropic-ratelimit-input-tokens-limit", "40000"),
        ("anthropic-ratelimit-input-tokens-remaining", "39000"),
        ("anthropic-ratelimit-output-tokens-limit", "8000"),
        ("anthropic-ratelimit-output-tokens-remaining", "7990"),
        ("anthropic-ratelimit-tokens-limit", "48000"),
        ("anthropic-ratelimit-tokens-remaining", "not-a-number"),
        ("Retry-After", "20"),
    ]
    got = read_rate_limits(headers, NOW)
    assert got is not None and got.retry_after == 20.0
    assert got.limits == (
        RateLimit(kind="requests", limit=50, remaining=0, reset=20.0),
        RateLimit(kind="tokens", limit=48000, remaining=None),
        RateLimit(kind="input_tokens", limit=40000, remaining=39000),
        RateLimit(kind="output_tokens", limit=8000, remaining=7990),
    )
    assert got.attributes()["taotrace.ratelimit.retry_after"] == 20.0


def test_retry_after_as_a_date_and_in_milliseconds() -> None:
    got = read_rate_limits([("retry-after", "Thu, 03 Dec 2026 09:00:05 GMT")], NOW)
    assert got is not None and got.retry_after == 5.0 and got.limits == ()
    got = read_rate_limits([("retry-after", "1"), ("retry-after-ms", "250")], NOW)
    assert got is not None and got.retry_after == 0.25  # the precise one wins


def test_no_rate_limit_headers_no_record() -> None:
    assert read_rate_limits([("content-type", "text/plain"), ("x-ratelimit-other", "1")], NOW) is None


LIMIT_HEADERS = {
    "x-ratelimit-limit-requests": "100",
    "x-ratelimit-remaining-requests": "7",
    "x-ratelimit-reset-requests": "1m0s",
    "x-ratelimit-limit-tokens": "10000",
    "x-ratelimit-remaining-tokens": "9000",
}


async def test_spans_and_gauges_from_a_stream_and_a_429(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy() as p:
        p.serve(stream_handler(chat_stream(3), headers=LIMIT_HEADERS))
        async with client.post(p.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "stream": True}) as r:
            await r.read()
        p.serve(
            json_handler(
                {"error": {"message": "Rate limit reached", "type": "requests"}},
                status=429,
                headers={**LIMIT_HEADERS, "x-ratelimit-remaining-requests": "0", "retry-after": "12"},
            )
        )
        async with client.post(p.url + "/v1/chat/completions", json={"model": "gpt-4o-mini"}) as r:
            assert r.status == 429 and r.headers["retry-after"] == "12"  # forwarded untouched
        async with aiohttp.ClientSession() as s, s.get(p.metrics_url + "/metrics") as resp:
            text = await resp.text()
    first, second = (s for s in p.spans() if s.kind.name == "CLIENT")
    assert first.attributes["taotrace.ratelimit.requests.remaining"] == 7
    assert first.attributes["taotrace.ratelimit.requests.reset"] == 60.0
    assert first.attributes["taotrace.ratelimit.tokens.limit"] == 10000
    assert second.attributes["taotrace.ratelimit.requests.remaining"] == 0
    assert second.attributes["taotrace.ratelimit.retry_after"] == 12.0
    assert second.attributes["error.type"] == "rate_limited"
    assert 'taotrace_ratelimit_remaining{kind="requests",model="gpt-4o-mini",upstream="127.0.0.1"} 0.0' in text
    assert 'taotrace_ratelimit_remaining{kind="tokens",model="gpt-4o-mini",upstream="127.0.0.1"} 9000.0' in text
    assert 'taotrace_ratelimit_limit{kind="requests",model="gpt-4o-mini",upstream="127.0.0.1"} 100.0' in text
    assert (
        'taotrace_requests_total{api="chat_completions",error_type="rate_limited",model="gpt-4o-mini",status_code="429",upstream="127.0.0.1"} 1.0'
        in text
    )
    reset = next(
        line
        for line in text.splitlines()
        if line.startswith('taotrace_ratelimit_reset_timestamp_seconds{kind="requests"')
    )
    assert abs(float(reset.rsplit(" ", 1)[1]) - (p.records[-1].rate_limits.observed_at + 60)) < 1e-3


async def test_a_response_without_a_model_sets_no_gauge(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy() as p:
        p.serve(json_handler({"object": "list", "data": []}, headers=LIMIT_HEADERS))
        async with client.get(p.url + "/v1/models") as r:
            assert r.status == 200
        async with aiohttp.ClientSession() as s, s.get(p.metrics_url + "/metrics") as resp:
            text = await resp.text()
    assert "taotrace_ratelimit_remaining{" not in text  # the span still has the headers
    (root,) = (s for s in p.spans() if s.kind.name == "CLIENT")
    assert root.attributes["taotrace.ratelimit.requests.remaining"] == 7


def test_header_names_match_in_any_case_and_values_never_do() -> None:
    # Headers are skipped by their name's first letter before anything else: in any case, the
    # names read here still are, and a value never is.
    got = read_rate_limits(
        [("Server", "x"), ("X-RateLimit-Remaining-Requests", "7"), ("Anthropic-RateLimit-Tokens-Limit", "9")], NOW
    )
    assert got is not None
    assert got.limits == (RateLimit(kind="requests", remaining=7), RateLimit(kind="tokens", limit=9))
    assert read_rate_limits([("RETRY-AFTER-MS", "1500")], NOW) == RateLimits(retry_after=1.5, observed_at=NOW)
    assert read_rate_limits([("x-note", "x-ratelimit-remaining-requests: 7, retry-after: 1")], NOW) is None
    assert read_rate_limits((), NOW) is None
