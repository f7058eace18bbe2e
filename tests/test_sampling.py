"""Outcome-aware sampling: after a burst of mixed requests exactly the traces the rules keep are
exported, each saying why; metrics count every request."""

from __future__ import annotations

import asyncio
import json
import random

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased
from prometheus_client import CollectorRegistry

from proxy.config.settings import Settings, parse_thresholds
from proxy.telemetry.sampling import OutcomeSampling
from tests.conftest import ProxyFactory
from tests.fakes import chat_stream, stream_handler

BOTH_MODES = pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)  # and the spans a supervisor builds


def test_ratio_decisions_equal_trace_id_ratio_based() -> None:
    """A collector's (or another replica's) TraceIdRatioBased at the same ratio keeps the same traces."""
    rng = random.Random(3)
    for ratio in (0.0, 0.01, 0.25, 0.5, 0.999, 1.0):
        policy = OutcomeSampling(ratio=ratio)
        sdk = TraceIdRatioBased(ratio)
        for _ in range(2000):
            trace_id = rng.getrandbits(128)
            ours = policy.reason(trace_id, False, "", None, 0.1) == "ratio"
            theirs = sdk.should_sample(None, trace_id, "x").decision is Decision.RECORD_AND_SAMPLE
            assert ours == theirs, (ratio, hex(trace_id))


def test_rules_in_order() -> None:
    policy = OutcomeSampling(ratio=0.0, keep_errors=True, ttft_over=1.0, duration_over=10.0)
    assert policy.reason(1, True, "", None, 0.1) == "parent"
    assert policy.reason(1, False, "timeout", 5.0, 60.0) == "error"
    assert policy.reason(1, False, "", 1.5, 60.0) == "slow_ttft"
    assert policy.reason(1, False, "", 0.5, 60.0) == "slow_duration"
    assert policy.reason(1, False, "", 0.5, 1.0) is None
    assert OutcomeSampling(ratio=0.0, keep_errors=False).reason(1, False, "auth", None, 1.0) is None
    assert not OutcomeSampling().active  # ratio 1: every trace, nothing decided


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("", (None, None)),
        ("2.5", (2.5, None)),
        ("ttft=800ms", (0.8, None)),
        ("duration=60s, ttft=2", (2.0, 60.0)),
        ("DURATION=.5", (None, 0.5)),
    ],
)
def test_thresholds(text: str, parsed: tuple[float | None, float | None]) -> None:
    assert parse_thresholds(text) == parsed


@pytest.mark.parametrize("text", ["ttft", "latency=3", "ttft=-1", "ttft=0", "3h", "ttft=1,,x"])
def test_bad_thresholds_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected e.g. ttft=2.5"):
        Settings(keep_slower_than=text)


RATIO = 0.5
SLOW = 1.0  # the slow requests' first token; the rule keeps TTFT over 0.5 s (fast ones take ms)


async def upstream(request: web.Request) -> web.StreamResponse:
    kind = json.loads(await request.read())["model"]
    if kind == "error":
        return web.json_response({"error": {"message": "boom"}}, status=500)
    return await stream_handler(chat_stream(2), first_delay=SLOW if kind == "slow" else 0.0)(request)


@BOTH_MODES
async def test_a_burst_exports_exactly_the_kept_traces(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession, registry: CollectorRegistry
) -> None:
    rng = random.Random(11)
    plan = ["fast"] * 16 + ["error"] * 6 + ["slow"] * 6 + ["parent"] * 6 + ["unsampled"] * 4
    rng.shuffle(plan)

    async def send(kind: str) -> None:
        headers = {}
        if kind in ("parent", "unsampled"):
            flags = "01" if kind == "parent" else "00"
            headers["traceparent"] = f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-{flags}"
        model = "fast" if kind in ("parent", "unsampled") else kind
        async with client.post(
            p.url + "/v1/chat/completions", json={"model": model, "stream": True}, headers=headers
        ) as r:
            await r.read()

    async with start_proxy(sample_ratio=RATIO, keep_slower_than=f"ttft={SLOW / 2}") as p:
        p.serve(upstream)
        await asyncio.gather(*(send(kind) for kind in plan))
        await p.settled(len(plan))

    # The oracle: what each request should have become, from what the upstream saw.
    sdk = TraceIdRatioBased(RATIO)
    expected: dict[str, str] = {}
    for seen in p.upstream.seen:
        _version, trace_hex, _parent, flags = seen.headers["traceparent"].split("-")
        model = json.loads(seen.body)["model"]
        if flags == "00":
            continue  # the client said "not sampled": never recorded, never exported
        if model == "error":
            expected[trace_hex] = "error"
        elif model == "slow":
            expected[trace_hex] = "slow_ttft"
        elif sdk.should_sample(None, int(trace_hex, 16), "x").decision is Decision.RECORD_AND_SAMPLE:
            expected[trace_hex] = "ratio"
        else:
            expected[trace_hex] = "dropped"
    roots = {format(s.context.trace_id, "032x"): s for s in p.spans() if s.parent is None or s.parent.is_remote}
    client_traces = {format(s.context.trace_id, "032x") for s in roots.values() if s.parent is not None}
    assert len(client_traces) == 6  # the six sampled client traces, all kept
    for trace_hex in client_traces:
        assert roots[trace_hex].attributes["taotrace.sampling.reason"] == "parent"
        expected[trace_hex] = "parent"  # whatever its own outcome would have been
    kept = {t: why for t, why in expected.items() if why != "dropped"}
    assert {t: s.attributes["taotrace.sampling.reason"] for t, s in roots.items()} == kept
    assert {format(s.context.trace_id, "032x") for s in p.spans()} == set(kept)  # no child of a dropped trace
    assert 0 < sum(why == "dropped" for why in expected.values()) < 16  # the ratio did drop some fast ones

    records = p.records
    assert len(records) == len(plan)  # every request recorded ...
    assert registry.get_sample_value(
        "taotrace_requests_total",
        {"upstream": "127.0.0.1", "api": "chat_completions", "model": "fast", "status_code": "200", "error_type": ""},
    ) == plan.count("fast") + plan.count("parent") + plan.count("unsampled")  # ... and counted
    assert {r.trace_id for r in records if r.trace_id} == set(kept)  # exemplars only for kept traces
    assert sorted(r.sampling for r in records if r.trace_id is None and r.sampling) == ["dropped"] * (
        len(expected) - len(kept)
    )
