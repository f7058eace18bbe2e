"""Issue 14's "done when", end to end over real sockets: the simulator (rate-limited per key)
behind the real proxy with the example price table; three users, two keys, one of them run
out of its budget. Spans name the users and the keys' fingerprints (never the keys), costs are
the hand-computed ones, the rate-limit gauge falls to zero, and no per-user series appear."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from proxy.accounting.attribution import key_id
from proxy.config.settings import Settings
from proxy.exchange.record import RequestRecord
from proxy.serve import running
from proxy.sim import SimSettings
from proxy.sim import running as sim_running
from proxy.telemetry.span_pipeline import InMemorySpanExporter
from proxy.telemetry.tracing import Tracing

EXAMPLE = Path(__file__).resolve().parent.parent / "deploy" / "prices.example.toml"
SALT = "e2e-salt-0123456789"
KEY_A, KEY_B = "sk-team-a-SECRET-1", "sk-team-b-SECRET-2"
PROMPT = "Explain what a prefix cache does for a repeated system prompt, in one paragraph."


async def _chat(s: aiohttp.ClientSession, url: str, key: str, user: str, stream: bool) -> int:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "user": user,
        "stream": stream,
        "stream_options": {"include_usage": True},
    }
    async with s.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        await r.read()
        return r.status


async def _message(s: aiohttp.ClientSession, url: str, key: str, user: str) -> int:
    body = {
        "model": "gpt-4o-mini",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": PROMPT}],
        "metadata": {"user_id": user},
    }
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    async with s.post(url + "/v1/messages", json=body, headers=headers) as r:
        await r.read()
        return r.status


@pytest.mark.timeout(120)
async def test_three_users_two_keys_prices_and_a_rate_limited_key(
    tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    sim_settings = SimSettings(port=0, time_scale=0.05, tokenizer="estimate", rate_limit_requests=4)
    registry = CollectorRegistry()
    records: list[RequestRecord] = []
    async with sim_running(sim_settings) as sim:
        settings = Settings(
            upstream=sim.url, port=0, metrics_port=0, drain_seconds=1.0,
            prices=str(EXAMPLE), attribute_body_user=True, key_salt=SALT,
        )  # fmt: skip
        async with (
            running(settings, on_record=records.append, tracing=tracing, registry=registry) as p,
            aiohttp.ClientSession() as s,
        ):
            statuses = [
                await _chat(s, p.proxy_url, KEY_A, "alice", stream=True),
                await _chat(s, p.proxy_url, KEY_A, "bob", stream=False),
                await _message(s, p.proxy_url, KEY_A, "alice"),
            ]
            statuses += [await _chat(s, p.proxy_url, KEY_B, "carol", stream=True) for _ in range(5)]
            async with s.get(p.metrics_url + "/metrics") as r:
                metrics = await r.text()
    assert statuses == [200, 200, 200, 200, 200, 200, 200, 429]

    roots = [span for span in exporter.get_finished_spans() if span.kind.name == "CLIENT"]
    who = [(span.attributes.get("user.id"), span.attributes["taotrace.key.id"]) for span in roots]
    a, b = key_id(SALT.encode(), KEY_A), key_id(SALT.encode(), KEY_B)
    assert who == [("alice", a), ("bob", a), ("alice", a)] + [("carol", b)] * 5
    for span in exporter.get_finished_spans():
        text = repr(dict(span.attributes)) + span.name
        assert KEY_A not in text and KEY_B not in text

    # The sim's truth (tokenizer "estimate"): 32 prompt tokens, 8 output; after the first request
    # 16 of the 32 come from its prefix cache. The Anthropic answer says input_tokens=16 plus
    # cache_read_input_tokens=16; the proxy counts 32 input, like OpenAI's prompt_tokens.
    usage = [(r.usage.input_tokens, r.usage.cached_input_tokens, r.usage.output_tokens) for r in records]
    assert usage == [(32, 0, 8)] + [(32, 16, 8)] * 6 + [(None, None, None)]
    # gpt-4o-mini at 0.15 / 0.075 (cached) / 0.60 per million tokens:
    #   first:  32 x 0.15 + 8 x 0.60                 = 9.6 per million
    #   others: 16 x 0.15 + 16 x 0.075 + 8 x 0.60    = 8.4 per million (cache saves 16 x 0.075 = 1.2)
    costs = [span.attributes.get("taotrace.cost") for span in roots]
    assert costs[-1] is None and costs[:-1] == pytest.approx([9.6e-6] + [8.4e-6] * 6, rel=1e-12)

    remaining = [
        next(rl.remaining for rl in r.rate_limits.limits if rl.kind == "requests") for r in records if r.rate_limits
    ]
    assert remaining == [3, 2, 1, 3, 2, 1, 0, 0]  # key A's budget, then key B's, run out
    assert roots[-1].attributes["error.type"] == "rate_limited"
    assert 1 <= roots[-1].attributes["taotrace.ratelimit.retry_after"] <= 60

    series = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line[:1] != "#"}
    assert series['taotrace_ratelimit_remaining{kind="requests",model="gpt-4o-mini",upstream="127.0.0.1"}'] == 0
    assert series['taotrace_ratelimit_limit{kind="requests",model="gpt-4o-mini",upstream="127.0.0.1"}'] == 4
    cost = series['taotrace_cost_total{api="chat_completions",model="gpt-4o-mini",upstream="127.0.0.1"}']
    assert cost == pytest.approx((9.6 + 5 * 8.4) / 1e6, rel=1e-12)
    assert series['taotrace_cost_total{api="messages",model="gpt-4o-mini",upstream="127.0.0.1"}'] == pytest.approx(
        8.4e-6, rel=1e-12
    )
    assert series[
        'taotrace_cost_cache_savings_total{api="chat_completions",model="gpt-4o-mini",upstream="127.0.0.1"}'
    ] == pytest.approx(6e-6)
    assert (
        series[
            'taotrace_requests_total{api="chat_completions",error_type="rate_limited",model="gpt-4o-mini",status_code="429",upstream="127.0.0.1"}'
        ]
        == 1
    )
    # No --metric-label: no per-user or per-key series, and no user or key anywhere in /metrics.
    assert "taotrace_attributed" not in metrics
    for secret in ("alice", "bob", "carol", a, b, KEY_A, KEY_B):
        assert secret not in metrics
