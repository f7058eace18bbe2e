"""Phase timing against an upstream with a known schedule: 300 ms prefill, then 20 ms per token.

The oracle is what the upstream and the client did, not the schedule: every instant the proxy
records lies between the upstream's write of those bytes and the client's receipt of them, on
the one monotonic clock they all read (tests/stamps.py). That holds on any machine, however
loaded, and still catches a phase measured from the wrong event: the first byte (the role chunk,
written 300 ms before the first token) taken for the first token, or TTFT divided by tokens.
"""

from __future__ import annotations

import json

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from proxy.exchange.record import RequestRecord
from tests.conftest import Proxied
from tests.fakes import chat_chunk, named, sse, usage_chunk
from tests.stamps import Stamps, clock, read_stamped, scheduled_handler

PREFILL = 0.300
PER_TOKEN = 0.020
TOKENS = 25
FIRST, LAST = 1, TOKENS  # the frames of the first and last tokens (frame 0 is the role chunk)


BOTH_MODES = pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)  # and the spans a supervisor builds


def scheduled_chat() -> list[bytes]:
    """Role-only chunk at once (first byte, not a token), first token after the prefill."""
    frames = sse(chat_chunk(role="assistant", content=""), done=False)
    frames += sse(*[chat_chunk(f"t{i}") for i in range(TOKENS)], done=False)
    frames += sse(chat_chunk(finish="stop"), usage_chunk(40, TOKENS), done=True)
    return frames


async def stream_with_schedule(proxy: Proxied, client: aiohttp.ClientSession) -> Stamps:
    frames = scheduled_chat()
    stamps = Stamps()
    proxy.serve(scheduled_handler(frames, [0.0, PREFILL] + [PER_TOKEN] * (TOKENS - 1) + [0.0, 0.0, 0.0], stamps))
    stamps.sent = clock()
    async with client.post(proxy.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "stream": True}) as r:
        assert r.status == 200
        assert await read_stamped(r, frames, stamps) == b"".join(frames)
    return stamps


def assert_bracketed(rec: RequestRecord, stamps: Stamps) -> None:
    """Each instant the proxy recorded lies between the upstream's write and the client's receipt."""
    t = rec.timing
    assert stamps.sent <= t.start <= stamps.entered  # the head arrived, then the proxy went upstream
    assert t.ttfb is not None and stamps.between(t.start + t.ttfb, 0)  # the role chunk is the first byte
    assert stamps.between(t.first_token, FIRST), (t.first_token, stamps.writes[:2], stamps.received[:2])
    assert stamps.between(t.last_token, LAST)
    assert len(t.itl) == TOKENS - 1 and isinstance(t.itl, tuple)  # one process: the values themselves
    for k, gap in enumerate(t.itl, start=FIRST + 1):  # between the tokens of frames k - 1 and k
        assert stamps.writes[k] - stamps.received[k - 1] <= gap <= stamps.received[k] - stamps.writes[k - 1]


async def test_ttft_tpot_and_phases_match_the_schedule(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    stamps = await stream_with_schedule(proxy, client)
    rec = proxy.records[-1]
    t = rec.timing
    assert_bracketed(rec, stamps)
    assert t.first_token is not None and t.last_token is not None and t.sent is not None
    assert t.ttft == pytest.approx(t.first_token - t.start, abs=1e-9)
    assert t.ttfb < t.ttft  # the role chunk came first: first byte is not first token
    assert t.prefill_wait == pytest.approx(t.first_token - t.sent, abs=1e-9)
    assert t.network == pytest.approx(t.sent - t.start, abs=1e-9)
    assert t.decode == pytest.approx(t.last_token - t.first_token, abs=1e-9)
    assert t.tpot == pytest.approx(t.decode / (TOKENS - 1))  # per token after the first, not TTFT / tokens
    assert isinstance(t.itl, tuple) and sum(t.itl) == pytest.approx(t.decode)
    assert rec.usage.output_tokens == TOKENS
    assert rec.usage_source == "reported"


@BOTH_MODES
async def test_phase_spans_follow_the_schedule(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    stamps = await stream_with_schedule(proxy, client)
    root = (await proxy.settled_spans("chat gpt-4o-mini"))[-1]
    rec = (await proxy.settled(1))[-1]
    assert_bracketed(rec, stamps)  # a worker's record too: the monotonic clock is the machine's
    t = rec.timing
    children = {s.name: s for s in proxy.spans() if s.parent is not None and s.parent.span_id == root.context.span_id}
    assert set(children) == {"network", "prefill_wait", "decode"}
    net, pre, dec = children["network"], children["prefill_wait"], children["decode"]
    assert root.start_time == net.start_time
    assert net.end_time == pre.start_time and pre.end_time == dec.start_time
    assert dec.end_time <= root.end_time
    # The spans carry the record's instants (to the microsecond: epoch ns from monotonic seconds).
    assert (pre.end_time - root.start_time) / 1e9 == pytest.approx(t.ttft, abs=1e-6)
    assert (net.end_time - net.start_time) / 1e9 == pytest.approx(t.network, abs=1e-6)
    assert (dec.end_time - dec.start_time) / 1e9 == pytest.approx(t.decode, abs=1e-6)
    assert root.attributes["taotrace.ttft"] == pytest.approx(t.ttft)


async def test_histograms_observe_the_schedule(
    proxy: Proxied, client: aiohttp.ClientSession, registry: CollectorRegistry
) -> None:
    stamps = await stream_with_schedule(proxy, client)
    t = proxy.records[-1].timing
    assert_bracketed(proxy.records[-1], stamps)
    labels = {"upstream": "127.0.0.1", "api": "chat_completions", "model": "gpt-4o-mini"}
    ttft_sum = registry.get_sample_value("taotrace_time_to_first_token_seconds_sum", labels)
    assert ttft_sum == pytest.approx(t.ttft)
    assert registry.get_sample_value("taotrace_time_to_first_token_seconds_count", labels) == 1
    tpot_sum = registry.get_sample_value("taotrace_time_per_output_token_seconds_sum", labels)
    assert tpot_sum == pytest.approx(t.tpot)
    assert registry.get_sample_value("taotrace_inter_token_latency_seconds_count", labels) == TOKENS - 1
    for phase in ("network", "prefill_wait", "decode"):
        assert registry.get_sample_value("taotrace_phase_duration_seconds_count", {**labels, "phase": phase}) == 1
    assert registry.get_sample_value("taotrace_tokens_total", {**labels, "type": "output"}) == TOKENS
    assert registry.get_sample_value("taotrace_tokens_total", {**labels, "type": "input"}) == 40


async def test_non_streaming_requests_stay_out_of_token_histograms(
    proxy: Proxied, client: aiohttp.ClientSession, registry: CollectorRegistry
) -> None:
    from tests.fakes import json_handler

    proxy.serve(
        json_handler(
            {
                "id": "x",
                "model": "m",
                "choices": [{"message": {"content": "hi"}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 7},
            }
        )
    )
    async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m"}) as r:
        await r.read()
    labels = {"upstream": "127.0.0.1", "api": "chat_completions", "model": "m"}
    assert registry.get_sample_value("taotrace_request_duration_seconds_count", labels) == 1
    assert registry.get_sample_value("taotrace_phase_duration_seconds_count", {**labels, "phase": "network"}) == 1
    assert not registry.get_sample_value("taotrace_time_to_first_token_seconds_count", labels)
    assert not registry.get_sample_value("taotrace_time_per_output_token_seconds_count", labels)
    assert registry.get_sample_value("taotrace_tokens_total", {**labels, "type": "output"}) == 7


@pytest.mark.parametrize("api", ["responses", "messages", "completions"])
async def test_each_dialect_is_timed_from_its_first_token(
    api: str, proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    if api == "responses":
        frames = [
            named(
                "response.created",
                {"type": "response.created", "response": {"id": "r", "model": "m", "status": "in_progress"}},
            ),
            named("response.in_progress", {"type": "response.in_progress"}),
            *[
                named("response.output_text.delta", {"type": "response.output_text.delta", "delta": f"w{i}"})
                for i in range(10)
            ],
            named(
                "response.completed",
                {
                    "type": "response.completed",
                    "response": {
                        "id": "r",
                        "model": "m",
                        "status": "completed",
                        "usage": {"input_tokens": 3, "output_tokens": 10},
                    },
                },
            ),
        ]
        path = "/v1/responses"
    elif api == "messages":
        frames = [
            named(
                "message_start",
                {
                    "type": "message_start",
                    "message": {"id": "m", "model": "claude", "usage": {"input_tokens": 3, "output_tokens": 1}},
                },
            ),
            named(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            named("ping", {"type": "ping"}),
            *[
                named(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f"w{i}"}},
                )
                for i in range(10)
            ],
            named("content_block_stop", {"type": "content_block_stop", "index": 0}),
            named(
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 10}},
            ),
            named("message_stop", {"type": "message_stop"}),
        ]
        path = "/v1/messages"
    else:
        frames = sse(*[{"id": "c", "model": "m", "choices": [{"index": 0, "text": f"w{i}"}]} for i in range(10)])
        path = "/v1/completions"
    # the non-token head frames come at once; the first token waits 200 ms
    n_head = {"responses": 2, "messages": 3, "completions": 0}[api]
    stamps = Stamps()
    proxy.serve(scheduled_handler(frames, [0.2 if i == n_head else 0.01 for i in range(len(frames))], stamps))
    stamps.sent = clock()
    async with client.post(proxy.url + path, data=json.dumps({"model": "m", "stream": True})) as r:
        assert r.status == 200
        assert await read_stamped(r, frames, stamps) == b"".join(frames)
    rec = proxy.records[-1]
    assert rec.api == api
    assert rec.timing.token_events == 10
    # The first token's frame, not the head frames written 200 ms before it.
    assert stamps.between(rec.timing.first_token, n_head), (rec.timing.first_token, stamps.writes, stamps.received)
    assert rec.timing.ttft == pytest.approx(rec.timing.first_token - rec.timing.start, abs=1e-9)
    assert rec.usage.output_tokens == 10
