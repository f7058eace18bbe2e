"""The simulator's rate-limit budgets and headers, and its embeddings endpoint."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator

import aiohttp
import pytest

from proxy.accounting.ratelimits import RateLimit, read_rate_limits
from proxy.sim import SimRunning, SimSettings, running
from proxy.sim.ratelimit import Budgets, Quota, go_duration, quota_headers

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize(
    "seconds,text", [(0.02, "20ms"), (0.0004, "0ms"), (1, "1s"), (59.5, "59.5s"), (360, "6m0s"), (3725, "1h2m5s")]
)
def test_go_durations(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_budgets_are_per_key_fixed_windows() -> None:
    now = [100.0]
    budgets = Budgets(requests=2, tokens=100, window=60, clock=lambda: now[0])
    first = budgets.charge("a", 30)
    assert (first.remaining_requests, first.remaining_tokens, first.reset, first.allowed) == (1, 70, 60.0, True)
    now[0] = 110.0
    assert budgets.charge("a", 80).allowed is False  # 30 + 80 tokens > 100: refused, nothing spent
    second = budgets.charge("a", 70)
    assert (second.remaining_requests, second.remaining_tokens, second.reset) == (0, 0, 50.0)
    assert budgets.charge("a", 0).allowed is False  # out of requests
    assert budgets.charge("b", 10).allowed is True  # another key, its own window
    now[0] = 160.0
    assert budgets.charge("a", 10) == Quota(
        requests=2, remaining_requests=1, tokens=100, remaining_tokens=90, reset=60.0, allowed=True
    )


def test_the_headers_read_back_as_what_they_say() -> None:
    quota = Quota(requests=10, remaining_requests=0, tokens=500, remaining_tokens=20, reset=6.5, allowed=False)
    now = 1_800_000_000.25
    openai_style = quota_headers("chat_completions", quota, now)
    assert openai_style["x-ratelimit-reset-requests"] == "6.5s" and openai_style["retry-after"] == "7"
    got = read_rate_limits(openai_style.items(), now)
    assert got is not None and got.retry_after == 7.0
    assert got.limits == (
        RateLimit(kind="requests", limit=10, remaining=0, reset=6.5),
        RateLimit(kind="tokens", limit=500, remaining=20, reset=6.5),
    )
    anthropic_style = quota_headers("messages", quota, now)
    assert anthropic_style["anthropic-ratelimit-tokens-reset"] == "2027-01-15T08:00:07Z"  # ceil(now + 6.5)
    got = read_rate_limits(anthropic_style.items(), now)
    assert got is not None and [(rl.kind, rl.remaining, rl.reset) for rl in got.limits] == [
        ("requests", 0, 6.75),
        ("tokens", 20, 6.75),
    ]


@pytest.fixture
async def limited() -> AsyncIterator[SimRunning]:
    settings = SimSettings(port=0, time_scale=0.05, rate_limit_requests=2, rate_limit_tokens=100_000)
    async with running(settings) as srv:
        yield srv


async def test_a_key_over_budget_gets_429_with_retry_after(limited: SimRunning) -> None:
    async with aiohttp.ClientSession() as s:
        seen = []
        for key in ("k1", "k1", "k1", "k2"):
            headers = {"Authorization": f"Bearer {key}"}
            async with s.post(limited.base_url + "/chat/completions", json=CHAT, headers=headers) as r:
                body = await r.json()
                seen.append((r.status, r.headers.get("x-ratelimit-remaining-requests"), r.headers.get("retry-after")))
        assert body["usage"]["prompt_tokens"] > 0
        assert seen[:2] == [(200, "1", None), (200, "0", None)]
        status, remaining, retry_after = seen[2]
        assert (status, remaining) == (429, "0") and retry_after is not None and 1 <= int(retry_after) <= 60
        assert seen[3] == (200, "1", None)
        headers = {"x-api-key": "k3", "anthropic-version": "2023-06-01"}
        async with s.post(limited.url + "/v1/messages", json=CHAT, headers=headers) as r:
            assert r.status == 200 and r.headers["anthropic-ratelimit-requests-remaining"] == "1"
            assert r.headers["anthropic-ratelimit-tokens-reset"].endswith("Z")


async def test_the_openai_sdk_sees_the_429(limited: SimRunning) -> None:
    import openai  # here, as below: the unit tier, which runs the rest of this module, need not load the SDK

    client = openai.AsyncOpenAI(base_url=limited.base_url, api_key="sdk-key", max_retries=0)
    for _ in range(2):
        await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert caught.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    await client.close()


async def test_embeddings_through_the_sdk_and_errors() -> None:
    import openai

    async with running(SimSettings(port=0)) as sim:
        client = openai.AsyncOpenAI(base_url=sim.base_url, api_key="k", max_retries=0)
        got = await client.embeddings.create(
            model="text-embedding-3-small", input=["the food was delicious", "hi"], dimensions=8
        )
        assert [len(d.embedding) for d in got.data] == [8, 8] and [d.index for d in got.data] == [0, 1]
        assert abs(sum(v * v for v in got.data[0].embedding) - 1) < 1e-4
        assert got.usage.prompt_tokens == got.usage.total_tokens > 2
        again = await client.embeddings.create(model="text-embedding-3-small", input="hi", dimensions=8)
        assert again.data[0].embedding == got.data[1].embedding  # deterministic
        with pytest.raises(openai.NotFoundError):
            await client.embeddings.create(model="gpt-4o-mini", input="x")
        with pytest.raises(openai.BadRequestError):
            await client.embeddings.create(model="text-embedding-3-small", input="x", dimensions=5000)
        await client.close()
        async with aiohttp.ClientSession() as s:
            body = {
                "model": "text-embedding-3-small",
                "input": [[1, 2, 3]],
                "encoding_format": "base64",
                "dimensions": 4,
            }
            async with s.post(sim.base_url + "/embeddings", json=body) as r:
                data = await r.json()
        vector = struct.unpack("<4f", base64.b64decode(data["data"][0]["embedding"]))
        assert len(vector) == 4 and data["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
