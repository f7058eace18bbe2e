"""`--mirror`: a sampled copy of each request to a second upstream, compared pair by pair. The
policy alone (ratio, per-minute cap, concurrency, paths, headers), then end to end against two
fake upstreams: the client never waits for the mirror, no client credential reaches it, the caps
hold, and both records, the compare histograms and the span link come out."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from proxy.cli import main
from proxy.config.config import load
from proxy.config.settings import Settings
from proxy.exchange.mirror import MirrorPolicy, describe, mirror_headers, worker_share
from proxy.serve import mirror_notice
from tests.conftest import ProxyFactory
from tests.fakes import FakeUpstream, Handler, chat_stream, stream_handler

# --- the policy, pure --------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ratio_samples_the_share_asked_for() -> None:
    policy = MirrorPolicy("m", ratio=0.25, per_minute=10**6, concurrency=10**6, rng=random.Random(7))
    said = [policy.offer("/v1/chat/completions", "primary") for _ in range(4000)]
    assert 0.22 < said.count("") / 4000 < 0.28 and set(said) == {"", "ratio"}
    assert policy.dropped == {"per_minute": 0, "concurrency": 0}  # not sampled is not a drop


def test_per_minute_cap_is_a_sliding_minute_and_counted() -> None:
    clock = Clock()
    policy = MirrorPolicy("m", ratio=1.0, per_minute=3, concurrency=100, clock=clock)
    assert [policy.offer("/v1/messages", "p") for _ in range(5)] == ["", "", "", "per_minute", "per_minute"]
    clock.now += 59.9
    assert policy.offer("/v1/messages", "p") == "per_minute"
    clock.now += 0.2  # the first three are a minute old
    assert [policy.offer("/v1/messages", "p") for _ in range(4)] == ["", "", "", "per_minute"]
    assert policy.dropped["per_minute"] == 4


def test_concurrency_cap_frees_a_slot_when_a_copy_ends() -> None:
    policy = MirrorPolicy("m", ratio=1.0, per_minute=100, concurrency=2)
    assert [policy.offer("/v1/responses", "p") for _ in range(3)] == ["", "", "concurrency"]
    policy.done()
    assert policy.offer("/v1/responses", "p") == "" and policy.dropped["concurrency"] == 1


@pytest.mark.parametrize(
    ("path", "route", "said"),
    [
        ("/v1/chat/completions", "p", ""),
        ("/v1/messages/", "p", ""),
        ("/v1/embeddings", "p", "path"),
        ("/v1/models", "p", "path"),
        ("/v1/completions", "p", "path"),  # not in the default list
        ("/v1/chat/completions", "m", "path"),  # a request already going to the mirror
    ],
)
def test_only_the_listed_paths_are_copied(path: str, route: str, said: str) -> None:
    assert MirrorPolicy("m", ratio=1.0, per_minute=10).offer(path, route) == said


def test_a_groups_caps_are_shared_out_among_its_workers() -> None:
    assert [worker_share(10, i, 4) for i in range(4)] == [3, 3, 2, 2]  # the remainder to the first ones
    assert [worker_share(8, i, 2) for i in range(2)] == [4, 4]
    assert [worker_share(2, i, 3) for i in range(3)] == [1, 1, 1]  # at least one each
    assert worker_share(7, 0, 1) == 7


def test_headers_of_a_copy_carry_no_client_credential() -> None:
    client = [
        ("Authorization", "Bearer sk-client"), ("Cookie", "s=sk-client"), ("Content-Type", "application/json"),
        ("api-key", "sk-client"), ("anthropic-version", "2023-06-01"), ("X-Custom-Token", "sk-client"),
        ("Proxy-Authorization", "Basic sk-client"), ("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
    ]  # fmt: skip
    out = mirror_headers(client, "sk-mirror")
    assert "sk-client" not in repr(list(out.items()))
    assert out["Authorization"] == "Bearer sk-mirror" and out["anthropic-version"] == "2023-06-01"
    anthropic = mirror_headers([("x-api-key", "sk-client")], "sk-mirror")
    assert list(anthropic.items()) == [("x-api-key", "sk-mirror")]
    assert list(mirror_headers(client[:1], None).items()) == []


def test_refused_without_a_ratio_and_a_cap(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    assert main(["serve", "--mirror", "taotoken.net"]) == 2
    assert "--mirror-ratio" in capsys.readouterr().err
    assert main(["serve", "--mirror", "taotoken.net", "--mirror-ratio", "0.1"]) == 2
    assert "--mirror-max-per-minute" in capsys.readouterr().err
    with caplog.at_level(logging.ERROR, logger="taotrace"):  # found where the routes are loaded, at start
        assert main(["serve", "--mirror", "nope", "--mirror-ratio", "0.1", "--mirror-max-per-minute", "5"]) == 2
    assert [r.getMessage() for r in caplog.records] == ["--mirror 'nope' names no route; the routes: taotoken.net"]
    assert main(["serve", "--mirror-ratio", "0"]) == 2


def test_start_up_says_what_mirroring_costs(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(
        routes=["or:/or=https://openrouter.ai/api"], mirror="or", mirror_ratio=0.05, mirror_max_per_minute=10,
        mirror_key_env="OR_KEY",
    )  # fmt: skip
    said = mirror_notice(load(settings, {"OR_KEY": "sk-or-secret"}))
    assert "5% of requests to /chat/completions, /responses, /messages" in said
    assert "upstream or (https://openrouter.ai/api) with the key in $OR_KEY" in said
    assert "Token spend doubles on that share, and or receives copies of those prompts" in said
    assert "sk-or-secret" not in said
    with pytest.raises(ValueError, match="OR_KEY, which is not set"):
        load(settings, {})
    group = mirror_notice(
        load(settings.model_copy(update={"workers": 4, "mirror_max_per_minute": 10}), {"OR_KEY": "k"})
    )  # each worker decides alone, on its share of the caps
    assert "(at most 10 a minute, 4 at once, shared by 4 workers: 3 or 2 a minute and 1 at once each)" in group
    assert mirror_notice(load(Settings(), {})) == ""
    with caplog.at_level(logging.WARNING, logger="taotrace"):
        assert main(["serve", "--mirror", "taotoken.net", "--mirror-ratio", "0.1", "--mirror-max-per-minute", "5",
                     "--mirror-key-env", "TAOTRACE_TEST_UNSET_KEY"]) == 2  # fmt: skip
    assert "TAOTRACE_TEST_UNSET_KEY, which is not set" in caplog.text
    assert describe(MirrorPolicy("x", 1.0, 1), "http://h", None).endswith("receives copies of those prompts.")


# --- end to end ----------------------------------------------------------------------------------

PRIMARY = stream_handler(chat_stream(8), first_delay=0.02, gap=0.005)  # fast prefill, fast decode
CLIENT_KEY = "sk-client-canary-7777"
MIRROR_KEY = "sk-mirror-canary-8888"
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "same prompt"}]}


def stalling(seconds: float) -> Handler:
    """A mirror that stalls before its first token, then decodes slowly."""
    return stream_handler(chat_stream(5), first_delay=seconds, gap=0.03)


@pytest.fixture
async def mirror_upstream() -> AsyncIterator[FakeUpstream]:
    fake = await FakeUpstream(stalling(0.0)).start()
    yield fake
    await fake.close()


async def _chat(client: aiohttp.ClientSession, url: str) -> tuple[bytes, float]:
    t = time.monotonic()
    headers = {"Authorization": f"Bearer {CLIENT_KEY}", "Cookie": f"session={CLIENT_KEY}"}
    async with client.post(url + "/v1/chat/completions", json=BODY, headers=headers) as r:
        assert r.status == 200
        body = await r.read()
    return body, time.monotonic() - t


async def _until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _mirror_settings(mirror_url: str, **kw: object) -> dict[str, object]:
    return {
        "routes": [f"mirror:/mirror={mirror_url}"], "mirror": "mirror", "mirror_ratio": 1.0,
        "mirror_max_per_minute": 100, "mirror_key_env": "TAOTRACE_TEST_MIRROR_KEY", **kw,
    }  # fmt: skip


# One process, and a group of two workers: the copy runs in the serving process, its record,
# drops and span go where the request's go.
GROUPS = pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)


@GROUPS
async def test_a_stalling_mirror_never_delays_the_client_and_the_pair_is_recorded(
    start_proxy: ProxyFactory,
    upstream: FakeUpstream,
    mirror_upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    registry: CollectorRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TAOTRACE_TEST_MIRROR_KEY", MIRROR_KEY)
    upstream.handler = PRIMARY
    mirror_upstream.handler = stalling(2.0)
    async with start_proxy(**_mirror_settings(mirror_upstream.url)) as p:
        body, took = await _chat(client, p.url)
        assert body == b"".join(chat_stream(8))  # byte-exact, the primary's alone
        # The client is done long before the mirror's first token (2 s away).
        assert took < 1.5, took
        (primary,) = await p.settled(1)
        assert not mirror_upstream.completed
        await p.settled(2, timeout=15.0)
        async with client.get(p.metrics_url + "/api/requests") as r:
            rows = (await r.json())["requests"]
    mirror = p.records[1]
    assert primary.pair_id is not None and mirror.pair_id == primary.pair_id
    assert (primary.mirror, mirror.mirror, primary.upstream, mirror.upstream) == (False, True, "127.0.0.1", "mirror")
    assert mirror.timing.ttft is not None and primary.timing.ttft is not None
    assert mirror.timing.ttft > 1.9 > primary.timing.ttft
    assert primary.timing.duration < 1.5
    # The mirror got the same body, its own key, and nothing of the client's credentials.
    (seen,) = mirror_upstream.seen
    assert seen.body == upstream.seen[0].body and seen.path_qs == "/v1/chat/completions"
    assert seen.headers["Authorization"] == f"Bearer {MIRROR_KEY}"
    mirror_saw = repr(list(seen.headers.items()))
    assert CLIENT_KEY not in mirror_saw and "Cookie" not in mirror_saw
    assert MIRROR_KEY not in repr(list(upstream.seen[0].headers.items()))
    # The difference, by direction: the mirror was slower by ~2 s.
    labels = {"upstream": "127.0.0.1", "mirror": "mirror", "api": "chat_completions", "model": "m"}
    ttft = {"direction": "mirror_slower", **labels}
    assert registry.get_sample_value("taotrace_compare_ttft_difference_seconds_count", ttft) == 1
    diff = registry.get_sample_value("taotrace_compare_ttft_difference_seconds_sum", ttft)
    assert diff == pytest.approx(mirror.timing.ttft - primary.timing.ttft)
    tpot = {"direction": "mirror_slower", **labels}
    assert registry.get_sample_value("taotrace_compare_tpot_difference_seconds_count", tpot) == 1
    assert (
        registry.get_sample_value(
            "taotrace_mirror_requests_total", {"upstream": "mirror", "api": "chat_completions", "error_type": ""}
        )
        == 1
    )
    # The copy is not a client request: the request families count only the primary.
    count = registry.get_sample_value(
        "taotrace_requests_total",
        {"upstream": "mirror", "api": "chat_completions", "model": "m", "status_code": "200", "error_type": ""},
    )
    assert count is None
    # Live view rows and the span link between the two traces.
    by_mirror = {row["mirror"]: row for row in rows}
    assert by_mirror[True]["pair_id"] == by_mirror[False]["pair_id"] == primary.pair_id
    roots = {s.attributes.get("taotrace.mirror"): s for s in p.spans("chat m")}
    link = roots[True].links[0].context
    assert (link.trace_id, link.span_id) == (roots[False].context.trace_id, roots[False].context.span_id)
    assert roots[True].context.trace_id != roots[False].context.trace_id
    assert roots[True].attributes["taotrace.pair_id"] == roots[False].attributes["taotrace.pair_id"]
    assert roots[True].attributes["server.port"] == int(mirror_upstream.url.rsplit(":", 1)[1])


async def test_caps_hold_and_refusals_are_counted(
    start_proxy: ProxyFactory,
    upstream: FakeUpstream,
    mirror_upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    registry: CollectorRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TAOTRACE_TEST_MIRROR_KEY", MIRROR_KEY)
    upstream.handler = PRIMARY
    mirror_upstream.handler = stalling(0.6)
    settings = _mirror_settings(mirror_upstream.url, mirror_max_per_minute=2, mirror_concurrency=1)
    async with start_proxy(**settings) as p:
        await _chat(client, p.url)  # copied
        await _chat(client, p.url)  # the first copy still runs: dropped (concurrency)
        await _until(lambda: len(mirror_upstream.completed) == 1)
        await _chat(client, p.url)  # copied: two this minute
        await _until(lambda: len(mirror_upstream.completed) == 2)
        await _chat(client, p.url)  # dropped (per_minute)
        async with client.post(p.url + "/v1/embeddings", json={"model": "e", "input": "x"}) as r:
            await r.read()  # never copied: not a listed path
        await _until(lambda: len(p.records) == 7)
    assert len(mirror_upstream.seen) == 2
    for reason in ("concurrency", "per_minute"):
        assert registry.get_sample_value("taotrace_mirror_dropped_total", {"reason": reason}) == 1
    assert sum(r.mirror for r in p.records) == 2


@GROUPS
async def test_a_dead_mirror_never_touches_the_client(
    start_proxy: ProxyFactory, upstream: FakeUpstream, client: aiohttp.ClientSession, registry: CollectorRegistry
) -> None:
    upstream.handler = PRIMARY
    settings = _mirror_settings("http://127.0.0.1:9", mirror_key_env=None)  # nothing listens on port 9
    async with start_proxy(**settings) as p:
        body, _ = await _chat(client, p.url)
        await p.settled(2)
    assert body == b"".join(chat_stream(8))
    primary, mirror = sorted(p.records, key=lambda r: r.mirror)
    assert primary.error_type == "" and mirror.error_type == "connect"
    assert (
        registry.get_sample_value(
            "taotrace_mirror_requests_total", {"upstream": "mirror", "api": "chat_completions", "error_type": "connect"}
        )
        == 1
    )
    assert registry.get_sample_value("taotrace_compare_ttft_difference_seconds_count", {
        "upstream": "127.0.0.1", "mirror": "mirror", "api": "chat_completions", "model": "m",
        "direction": "mirror_slower",
    }) is None  # fmt: skip


@GROUPS
async def test_the_live_view_shows_the_pair_and_counts_only_client_requests(
    start_proxy: ProxyFactory,
    upstream: FakeUpstream,
    mirror_upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TAOTRACE_TEST_MIRROR_KEY", MIRROR_KEY)
    upstream.handler = PRIMARY
    mirror_upstream.handler = stalling(0.3)
    async with start_proxy(**_mirror_settings(mirror_upstream.url)) as p:
        await _chat(client, p.url)
        (primary,) = await p.settled(1)
        assert primary.pair_id is not None
        async with client.get(f"{p.metrics_url}/api/pairs/{primary.pair_id}") as r:
            half = await r.json()  # the copy is still waiting for its first token
        await p.settled(2)
        async with client.get(f"{p.metrics_url}/api/pairs/{primary.pair_id}") as r:
            assert r.status == 200
            both = await r.json()
        async with client.get(p.metrics_url + "/api/summary") as r:
            summary = await r.json()
        async with client.get(p.metrics_url + "/api/pairs/0123456789abcdef") as r:
            assert r.status == 404
    mirror = p.records[1]
    assert half["request"]["record"]["pair_id"] == primary.pair_id
    assert half["mirror"] is None and half["differences"] is None
    assert both["request"]["id"] == primary.trace_id and both["mirror"]["id"] == mirror.trace_id
    assert both["mirror"]["record"]["mirror"] is True and both["mirror"]["record"]["upstream"] == "mirror"
    assert mirror.timing.ttft is not None and primary.timing.ttft is not None
    assert both["differences"]["ttft"] == pytest.approx(mirror.timing.ttft - primary.timing.ttft)
    assert both["differences"]["ttft"] > 0.25 and both["differences"]["output_tokens"] == 5 - 8
    assert both["differences"]["outcome"] == {"request": "ok", "mirror": "ok"}
    # The copy is not client traffic: one request in the statistics, and the pair apart.
    assert summary["requests"] == 1 and summary["models"]["m"]["requests"] == 1
    (group,) = summary["pairs"]
    assert (group["upstream"], group["mirror"], group["pairs"], group["both_ok"]) == ("127.0.0.1", "mirror", 1, 1)
    assert group["ttft_difference_p50"] == pytest.approx(both["differences"]["ttft"])


@pytest.mark.parametrize("proxy_workers", [2], indirect=True)
async def test_in_a_group_each_worker_keeps_its_share_and_the_supervisor_counts_the_drops(
    start_proxy: ProxyFactory,
    upstream: FakeUpstream,
    mirror_upstream: FakeUpstream,
    registry: CollectorRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TAOTRACE_TEST_MIRROR_KEY", MIRROR_KEY)
    upstream.handler = PRIMARY
    sent = 8
    # A group's cap of 2 a minute: one copy a minute for each of the two workers.
    async with start_proxy(**_mirror_settings(mirror_upstream.url, mirror_max_per_minute=2)) as p:
        for _ in range(sent):  # a connection each, so the kernel spreads them over the workers
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as own:
                await _chat(own, p.url)
        await p.settled(sent)

        def dropped() -> float:
            return registry.get_sample_value("taotrace_mirror_dropped_total", {"reason": "per_minute"}) or 0.0

        copies = len(mirror_upstream.seen)
        await _until(lambda: copies + dropped() == sent)
        await p.settled(sent + copies)
        assert sum(r.mirror for r in p.records) == copies
    assert 1 <= copies <= 2
    assert registry.get_sample_value("taotrace_mirror_dropped_total", {"reason": "concurrency"}) in (None, 0.0)
