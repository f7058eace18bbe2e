"""A reasoning model's stream through the proxy: the thinking phase, the answer's first token, and
hidden reasoning's estimate, in every dialect that streams reasoning.

The oracle is the scripted upstream's own write stamps (tests/stamps.py): the proxy's instant for
a frame lies between the upstream's write of it and the client's receipt, so each number the proxy
derives from two frames is within the wider of their two brackets of the same difference of
writes (1 ms on a quiet machine; the bracket itself on a loaded one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from proxy.exchange.record import RequestRecord
from tests.conftest import Proxied
from tests.fakes import chat_chunk, named, sse, usage_chunk
from tests.stamps import Stamps, clock, read_stamped, scheduled_handler

BOTH_MODES = pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)  # and the records a supervisor gets

PREFILL, THINK, STEP = 0.10, 0.15, 0.02  # before the first thought; the last thought to the answer; per token


@dataclass(frozen=True)
class Script:
    """One dialect's reasoning stream: its frames, which are reasoning and answer tokens, and where
    the thinking runs start and end (the frame of a run's first token, the frame that ends it)."""

    path: str
    frames: list[bytes]
    reasoning: list[int]
    answer: list[int]

    @property
    def first_reasoning(self) -> int:
        return self.reasoning[0]

    @property
    def first_answer(self) -> int:
        return self.answer[0]

    def delays(self) -> list[float]:
        """Head frames at once, the first thought after the prefill, the answer after thinking."""
        out = []
        for i in range(len(self.frames)):
            if i == self.first_reasoning:
                out.append(PREFILL)
            elif i == self.first_answer:
                out.append(THINK)
            elif i in self.reasoning or i in self.answer:
                out.append(STEP)
            else:
                out.append(0.0)
        return out


def _chat(field: str, *, empty_content: bool = False) -> Script:
    def thought(text: str) -> dict[str, object]:
        delta = {field: text}
        return chat_chunk("" if empty_content else None, **delta)  # vLLM: beside an empty content

    frames = sse(chat_chunk(role="assistant", content=""), done=False)
    frames += sse(*[thought(f"r{i}") for i in range(4)], done=False)
    frames += sse(*[chat_chunk(f"a{i}") for i in range(5)], done=False)
    usage = usage_chunk(10, 9, reasoning=4)
    frames += sse(chat_chunk(finish="stop"), usage, done=True)
    return Script("/v1/chat/completions", frames, [1, 2, 3, 4], [5, 6, 7, 8, 9])


def _responses(kind: str) -> Script:
    created = {"type": "response.created", "response": {"id": "r", "model": "o3", "status": "in_progress"}}
    frames = [named("response.created", created), named("response.in_progress", {"type": "response.in_progress"})]
    frames += [named(kind, {"type": kind, "delta": f"r{i}"}) for i in range(4)]
    frames.append(named(kind.replace(".delta", ".done"), {"type": kind.replace(".delta", ".done"), "text": "r"}))
    delta = "response.output_text.delta"
    frames += [named(delta, {"type": delta, "delta": f"a{i}"}) for i in range(5)]
    usage = {"input_tokens": 10, "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 4}}
    done = {"type": "response.completed", "response": {"id": "r", "model": "o3", "status": "completed", "usage": usage}}
    frames.append(named("response.completed", done))
    return Script("/v1/responses", frames, [2, 3, 4, 5], [7, 8, 9, 10, 11])


def _messages() -> Script:
    def block(index: int, kind: str, **extra: object) -> bytes:
        return named(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": {"type": kind, **extra}},
        )

    def delta(index: int, **d: object) -> bytes:
        return named("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})

    def stop(index: int) -> bytes:
        return named("content_block_stop", {"type": "content_block_stop", "index": index})

    start = {"type": "message_start", "message": {"id": "m", "model": "claude", "usage": {"input_tokens": 3}}}
    frames = [named("message_start", start), block(0, "thinking", thinking="")]
    frames += [delta(0, type="thinking_delta", thinking=f"r{i}") for i in range(4)]  # 2-5
    frames += [delta(0, type="signature_delta", signature="c2ln"), stop(0)]  # 6, 7: the signature is no token
    frames += [block(1, "redacted_thinking", data="ZW5j"), stop(1), block(2, "text", text="")]  # 8-10: no text
    frames += [delta(2, type="text_delta", text=f"a{i}") for i in range(5)]  # 11-15
    end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 40}}
    frames += [stop(2), named("message_delta", end), named("message_stop", {"type": "message_stop"})]
    return Script("/v1/messages", frames, [2, 3, 4, 5], [11, 12, 13, 14, 15])


SCRIPTS = {
    "chat reasoning_content": _chat("reasoning_content"),
    "chat reasoning": _chat("reasoning", empty_content=True),
    "responses reasoning_text": _responses("response.reasoning_text.delta"),
    "responses reasoning_summary_text": _responses("response.reasoning_summary_text.delta"),
    "messages thinking": _messages(),
}


async def stream(proxy: Proxied, client: aiohttp.ClientSession, script: Script, delays: list[float]) -> Stamps:
    stamps = Stamps()
    proxy.serve(scheduled_handler(script.frames, delays, stamps))
    stamps.sent = clock()
    async with client.post(proxy.url + script.path, data=json.dumps({"model": "o3", "stream": True})) as r:
        assert r.status == 200
        assert await read_stamped(r, script.frames, stamps) == b"".join(script.frames)
    return stamps


def within_writes(measured: float | None, stamps: Stamps, a: int, b: int) -> bool:
    """`measured` (the proxy's time from frame a to frame b) is the upstream's time between writing
    them, to within 1 ms or, on a loaded machine, the wider bracket of the two frames."""
    slack = max(1e-3, *(stamps.received[i] - stamps.writes[i] for i in (a, b)))
    return measured is not None and abs(measured - (stamps.writes[b] - stamps.writes[a])) <= slack


def assert_thinking(rec: RequestRecord, stamps: Stamps, script: Script) -> None:
    t = rec.timing
    r0, a0 = script.first_reasoning, script.first_answer
    assert stamps.between(t.first_token, r0), "TTFT keeps its meaning: the first token, a reasoning one"
    first_answer = t.thinking_spans[1]  # the instant the (one) reasoning run ended: the answer's first token
    assert stamps.between(first_answer, a0), (first_answer, stamps.writes[a0], stamps.received[a0])
    assert t.ttft == pytest.approx(t.first_token - t.start, abs=1e-9)  # type: ignore[operator]
    assert t.time_to_first_answer_token == pytest.approx(first_answer - t.start, abs=1e-9)
    assert within_writes(t.thinking, stamps, r0, a0), (t.thinking, stamps.writes[a0] - stamps.writes[r0])
    assert t.thinking == pytest.approx(t.time_to_first_answer_token - t.ttft, abs=1e-9)  # type: ignore[operator]
    assert t.thinking_total == pytest.approx(t.thinking)  # one run: no interleaving here
    assert len(t.thinking_spans) == 2 and t.thinking_spans[0] == pytest.approx(t.first_token, abs=1e-9)
    assert t.reasoning_token_events == len(script.reasoning)
    assert t.token_events == len(script.reasoning) + len(script.answer)
    assert within_writes(t.answer_tpot and t.answer_tpot * (len(script.answer) - 1), stamps, a0, script.answer[-1])
    assert t.thinking_estimated is None  # measured, so never estimated


@pytest.mark.parametrize("name", list(SCRIPTS))
async def test_each_dialect_s_thinking_and_answer_are_the_upstream_s_writes(
    name: str, proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    script = SCRIPTS[name]
    stamps = await stream(proxy, client, script, script.delays())
    rec = proxy.records[-1]
    assert rec.error_type == "" and rec.timing.ttft is not None
    assert_thinking(rec, stamps, script)


@BOTH_MODES
async def test_thinking_spans_and_histograms(
    proxy: Proxied, client: aiohttp.ClientSession, registry: CollectorRegistry
) -> None:
    script = SCRIPTS["chat reasoning_content"]
    stamps = await stream(proxy, client, script, script.delays())
    rec = (await proxy.settled(1))[-1]
    assert_thinking(rec, stamps, script)  # a worker's record too: the fields cross as plain values
    t = rec.timing
    root = (await proxy.settled_spans("chat o3"))[-1]
    decode = next(s for s in proxy.spans("decode") if s.parent.span_id == root.context.span_id)
    (thinking,) = [s for s in proxy.spans("thinking") if s.context.trace_id == root.context.trace_id]
    assert thinking.parent.span_id == decode.context.span_id  # the thinking is part of the decode
    assert thinking.start_time == decode.start_time
    assert (thinking.end_time - thinking.start_time) / 1e9 == pytest.approx(t.thinking, abs=1e-6)
    assert dict(thinking.attributes) == {"taotrace.estimated": False}
    a = root.attributes
    assert a["taotrace.ttft"] == pytest.approx(t.ttft)
    assert a["taotrace.time_to_first_answer_token"] == pytest.approx(t.time_to_first_answer_token)
    assert a["taotrace.thinking"] == pytest.approx(t.thinking)
    assert a["taotrace.thinking.total"] == pytest.approx(t.thinking)
    assert a["taotrace.reasoning.token_events"] == 4 and a["gen_ai.usage.reasoning.output_tokens"] == 4
    assert a["taotrace.reasoning.tpot"] == pytest.approx(t.thinking / 4)  # type: ignore[operator]
    assert a["taotrace.answer.tpot"] == pytest.approx(t.answer_tpot)
    assert "taotrace.thinking.estimated" not in a
    labels = {"upstream": "127.0.0.1", "api": "chat_completions", "model": "o3"}
    get = registry.get_sample_value
    assert get("taotrace_time_to_first_token_seconds_sum", labels) == pytest.approx(t.ttft)
    assert get("taotrace_time_to_first_answer_token_seconds_sum", labels) == pytest.approx(t.time_to_first_answer_token)
    assert get("taotrace_thinking_seconds_sum", labels) == pytest.approx(t.thinking)
    assert get("taotrace_thinking_seconds_count", labels) == 1
    assert get("taotrace_tokens_total", {**labels, "type": "reasoning"}) == 4


async def test_interleaved_thinking_around_a_tool_call(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    """Think, call a tool, think again, answer: every run is timed and spanned; the thinking phase
    (and its histogram) is the first run, the one that delayed the answer."""

    def call(args: str) -> dict[str, object]:
        return chat_chunk(tool_calls=[{"index": 0, "function": {"arguments": args}}])

    frames = sse(chat_chunk(role="assistant", content=""), done=False)
    frames += sse(*[chat_chunk(reasoning_content=f"r{i}") for i in range(3)], done=False)  # 1-3
    frames += sse(call('{"q":'), call('"x"}'), done=False)  # 4, 5: the answer begins with a tool call
    frames += sse(*[chat_chunk(reasoning_content=f"s{i}") for i in range(3)], done=False)  # 6-8: thinks again
    frames += sse(*[chat_chunk(f"a{i}") for i in range(3)], done=False)  # 9-11
    frames += sse(chat_chunk(finish="stop"), done=True)
    delays = [0.0, PREFILL, STEP, STEP, THINK, STEP, 0.1, STEP, STEP, 0.12, STEP, STEP, 0.0, 0.0]
    script = Script("/v1/chat/completions", frames, [1, 2, 3, 6, 7, 8], [4, 5, 9, 10, 11])
    stamps = await stream(proxy, client, script, delays)
    rec = proxy.records[-1]
    t = rec.timing
    assert within_writes(t.thinking, stamps, 1, 4)
    assert len(t.thinking_spans) == 4 and t.reasoning_token_events == 6
    assert stamps.between(t.thinking_spans[2], 6) and stamps.between(t.thinking_spans[3], 9)
    assert within_writes(t.thinking_spans[3] - t.thinking_spans[2], stamps, 6, 9)
    assert t.thinking_total == pytest.approx(t.thinking + t.thinking_spans[3] - t.thinking_spans[2])  # type: ignore[operator]
    root = (await proxy.settled_spans("chat o3"))[-1]
    runs = sorted((s for s in proxy.spans("thinking") if s.context.trace_id == root.context.trace_id),
                  key=lambda s: s.start_time)  # fmt: skip
    assert len(runs) == 2 and runs[0].parent.span_id == runs[1].parent.span_id  # both inside decode
    assert root.attributes["taotrace.thinking.total"] == pytest.approx(t.thinking_total)


HIDDEN = 10  # reasoning tokens reported, never streamed


def hidden_script(api: str) -> Script:
    if api == "chat_completions":
        frames = sse(chat_chunk(role="assistant", content=""), done=False)
        frames += sse(*[chat_chunk(f"a{i}") for i in range(5)], done=False)
        frames += sse(chat_chunk(finish="stop"), usage_chunk(10, 5 + HIDDEN, reasoning=HIDDEN), done=True)
        return Script("/v1/chat/completions", frames, [], [1, 2, 3, 4, 5])
    created = {"type": "response.created", "response": {"id": "r", "model": "o3", "status": "in_progress"}}
    item = {"type": "response.output_item.added", "item": {"type": "reasoning", "summary": []}}
    frames = [named("response.created", created), named("response.output_item.added", item)]
    kind = "response.output_text.delta"
    frames += [named(kind, {"type": kind, "delta": f"a{i}"}) for i in range(5)]
    usage = {"input_tokens": 10, "output_tokens": 5 + HIDDEN, "output_tokens_details": {"reasoning_tokens": HIDDEN}}
    done = {"type": "response.completed", "response": {"id": "r", "model": "o3", "status": "completed", "usage": usage}}
    frames.append(named("response.completed", done))
    return Script("/v1/responses", frames, [], [2, 3, 4, 5, 6])


@BOTH_MODES
@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_hidden_reasoning_is_estimated_and_labelled(
    api: str, proxy: Proxied, client: aiohttp.ClientSession, registry: CollectorRegistry
) -> None:
    script = hidden_script(api)
    first = script.first_answer
    delays = [0.4 if i == first else STEP if i in script.answer else 0.0 for i in range(len(script.frames))]
    stamps = await stream(proxy, client, script, delays)
    rec = (await proxy.settled(1))[-1]
    t = rec.timing
    assert stamps.between(t.first_token, first) and t.time_to_first_answer_token == t.ttft
    assert t.thinking is None and t.thinking_total is None and t.reasoning_token_events == 0  # nothing measured
    assert within_writes(t.answer_tpot and t.answer_tpot * 4, stamps, first, script.answer[-1])
    assert t.thinking_estimated == pytest.approx(HIDDEN * t.answer_tpot)  # type: ignore[operator]
    assert t.thinking_estimated < t.prefill_wait  # type: ignore[operator]
    root = (await proxy.settled_spans("chat o3"))[-1]  # both dialects' operation is `chat`
    assert root.attributes["taotrace.thinking.estimated"] == pytest.approx(t.thinking_estimated)
    assert root.attributes["gen_ai.usage.reasoning.output_tokens"] == HIDDEN
    assert "taotrace.thinking" not in root.attributes
    prefill = next(s for s in proxy.spans("prefill_wait") if s.context.trace_id == root.context.trace_id)
    (thinking,) = [s for s in proxy.spans("thinking") if s.context.trace_id == root.context.trace_id]
    assert thinking.parent.span_id == prefill.context.span_id  # a split of prefill_wait
    assert dict(thinking.attributes) == {"taotrace.estimated": True}
    assert thinking.end_time == prefill.end_time
    assert (thinking.end_time - thinking.start_time) / 1e9 == pytest.approx(t.thinking_estimated, abs=1e-6)
    labels = {"upstream": "127.0.0.1", "api": api, "model": "o3"}
    assert registry.get_sample_value("taotrace_time_to_first_answer_token_seconds_count", labels) == 1
    assert not registry.get_sample_value("taotrace_thinking_seconds_count", labels)  # never an estimate


async def test_one_answer_token_gives_no_estimate(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    frames = sse(chat_chunk("42"), chat_chunk(finish="stop"), usage_chunk(10, 1 + HIDDEN, reasoning=HIDDEN))
    script = Script("/v1/chat/completions", frames, [], [0])
    await stream(proxy, client, script, [0.2, 0.0, 0.0, 0.0])
    t = proxy.records[-1].timing
    assert t.answer_tpot is None and t.thinking_estimated is None  # no pace of its own to estimate with
    assert proxy.records[-1].usage.reasoning_tokens == HIDDEN
