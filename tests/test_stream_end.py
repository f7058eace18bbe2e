"""A stream that ends without its API's end is `stream_incomplete`, never a success.

Each dialect's end (docs/errors.md, "The end of a stream"): chat and legacy completions a choice
with a `finish_reason` (`data: [DONE]` optional), Responses `response.completed` / `.incomplete` /
`.failed`, Anthropic `message_delta` with a `stop_reason` (`message_stop` optional). Readers judge
it (pure), `decide` names it, and the proxy records it for streams a real server sent that way:
empty, interrupted with `[DONE]`, or simply stopped.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from proxy.dialects import StreamReader, reader_for
from proxy.dialects.sse import SSEDecoder
from proxy.exchange.outcome import Facts, Outcome, decide
from proxy.sim import SimSettings
from proxy.sim import running as sim_running
from tests.conftest import Proxied, ProxyFactory
from tests.fakes import chat_chunk, chat_stream, named, sse, stream_handler, usage_chunk


def _read(api: str, frames: list[bytes]) -> StreamReader:
    reader = reader_for(api)
    assert reader is not None
    decoder = SSEDecoder()
    for frame in frames:
        for event in decoder.feed(frame):
            reader.feed(event)
    return reader


def _anthropic(*, delta: bool = True, stop: bool = True, reason: str | None = "end_turn") -> list[bytes]:
    frames = [
        named("message_start", {"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        named("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        named("ping", {"type": "ping"}),
        named("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        named("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]  # fmt: skip
    if delta:
        frames.append(
            named(
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 1}},
            )
        )
    if stop:
        frames.append(named("message_stop", {"type": "message_stop"}))
    return frames


def _responses(end: str | None) -> list[bytes]:
    frames = [
        named("response.created", {"type": "response.created", "response": {"id": "resp_1", "model": "gpt-4o"}}),
        named("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Hi"}),
    ]
    if end is not None:
        status = end.removeprefix("response.")
        body = {"id": "resp_1", "model": "gpt-4o", "status": status, "usage": {"input_tokens": 3, "output_tokens": 1}}
        frames.append(named(end, {"type": end, "response": body}))
    return frames


def _completions(finish: str | None, done: bool = True) -> list[bytes]:
    chunk: dict[str, Any] = {"id": "cmpl-1", "object": "text_completion", "model": "m"}
    return sse(
        {**chunk, "choices": [{"index": 0, "text": "Hi", "finish_reason": None}]},
        {**chunk, "choices": [{"index": 0, "text": "", "finish_reason": finish}]},
        done=done,
    )


# --------------------------------------------------------------------------- readers (pure)

ENDED = [
    ("chat_completions", chat_stream(3)),
    ("chat_completions", chat_stream(3)[:-1]),  # no [DONE]: some servers never send it
    ("chat_completions", sse(chat_chunk("a"), chat_chunk(finish="length"), done=False)),
    ("chat_completions", sse(chat_chunk(finish="tool_calls", tool_calls=[{"index": 0, "function": {"arguments": "{}"}}]))),
    ("completions", _completions("stop")),
    ("completions", _completions("length", done=False)),
    ("responses", _responses("response.completed")),
    ("responses", _responses("response.incomplete")),  # max_output_tokens: an end, not a failure
    ("messages", _anthropic()),
    ("messages", _anthropic(stop=False)),  # message_stop left out by some gateways
]  # fmt: skip

UNENDED = [
    ("chat_completions", []),
    ("chat_completions", sse()),  # only [DONE]
    ("chat_completions", sse(chat_chunk(role="assistant", content=""), chat_chunk("a"), chat_chunk("b"))),  # [DONE], no finish
    ("chat_completions", sse(chat_chunk("a"), usage_chunk(3, 1), done=False)),
    ("completions", _completions(None)),
    ("responses", []),
    ("responses", _responses(None)),
    ("messages", []),
    ("messages", _anthropic(delta=False, stop=False)),
    ("messages", _anthropic(delta=False)),  # message_stop with no stop_reason before it
    ("messages", _anthropic(reason=None)),  # message_delta without a stop_reason
]  # fmt: skip


@pytest.mark.parametrize(("api", "frames"), ENDED)
def test_a_stream_with_its_apis_end_is_complete(api: str, frames: list[bytes]) -> None:
    assert _read(api, frames).complete


@pytest.mark.parametrize(("api", "frames"), UNENDED)
def test_a_stream_without_its_apis_end_is_not(api: str, frames: list[bytes]) -> None:
    assert not _read(api, frames).complete


def test_done_alone_still_means_the_client_has_the_whole_stream() -> None:
    # `[DONE]` is the terminal event a client stops at (not client_abort when it leaves), but
    # without a finish reason the answer did not end: the two questions stay apart.
    reader = _read("chat_completions", sse(chat_chunk("a")))
    assert reader.done and not reader.complete


# --------------------------------------------------------------------------- decide (pure)


def test_an_unfinished_stream_is_stream_incomplete() -> None:
    assert decide(Facts(status=200, unfinished=True)) == Outcome(200, "stream_incomplete")


def test_the_streams_own_error_and_an_error_status_come_first() -> None:
    assert decide(Facts(status=200, unfinished=True, stream_error=True)) == Outcome(200, "stream_error")
    assert decide(Facts(status=500, unfinished=True)) == Outcome(500, "upstream_error")


def test_a_client_leaving_after_done_without_a_finish_reason_is_not_a_success() -> None:
    facts = Facts(status=200, end="client_left", whole=True, unfinished=True)
    assert decide(facts) == Outcome(200, "stream_incomplete", at_last_byte=True)


def test_early_ends_keep_their_words() -> None:
    assert decide(Facts(status=200, end="client_left", unfinished=True)) == Outcome(200, "client_abort")
    assert decide(Facts(status=200, end="stream_cut", unfinished=True)) == Outcome(200, "stream_cut")


# --------------------------------------------------------------------------- through the proxy

CASES = [
    ("/v1/chat/completions", [], "stream_incomplete"),
    ("/v1/chat/completions", sse(chat_chunk("a"), chat_chunk("b")), "stream_incomplete"),
    ("/v1/chat/completions", chat_stream(2)[:-1], ""),
    ("/v1/completions", _completions(None), "stream_incomplete"),
    ("/v1/responses", _responses(None), "stream_incomplete"),
    ("/v1/responses", _responses("response.incomplete"), ""),
    ("/v1/messages", _anthropic(delta=False, stop=False), "stream_incomplete"),
    ("/v1/messages", _anthropic(stop=False), ""),
]


def _counted(text: str, error_type: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith("taotrace_requests_total{") and f'error_type="{error_type}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)
@pytest.mark.parametrize(("path", "frames", "word"), CASES)
async def test_the_proxy_records_how_each_stream_ended(
    proxy: Proxied, client: aiohttp.ClientSession, path: str, frames: list[bytes], word: str
) -> None:
    proxy.serve(stream_handler(frames, gap=0.002))
    async with client.post(proxy.url + path, json={"model": "m", "stream": True}) as r:
        body = await r.read()
        assert r.status == 200
    assert body == b"".join(frames)  # forwarded as it came, whatever the verdict
    (record,) = await proxy.settled(1)
    assert (record.status_code, record.error_type) == (200, word)
    async with client.get(proxy.metrics_url + "/metrics") as m:
        assert _counted(await m.text(), word) == 1
    await proxy.settled_spans()
    (root,) = [s for s in proxy.spans() if s.name not in ("network", "prefill_wait", "decode")]
    assert root.attributes.get("error.type") == (word or None)
    assert root.status.is_ok is (word == "")
    assert root.attributes["http.response.status_code"] == 200


async def test_an_incomplete_streams_timing_and_counted_usage_are_kept(
    proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    frames = sse(chat_chunk(role="assistant", content=""), *(chat_chunk(f"t{i}") for i in range(5)))
    proxy.serve(stream_handler(frames, first_delay=0.03, gap=0.005))
    async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
        await r.read()
    (record,) = await proxy.settled(1)
    assert record.error_type == "stream_incomplete"
    assert record.usage.output_tokens == 5 and record.usage_source == "counted"
    assert record.timing.ttft is not None and record.timing.ttft >= 0.03
    assert record.timing.tpot is not None and len(record.timing.itl) == 4


async def test_sync_openai_sdk_reads_an_interrupted_stream_and_the_proxy_says_so(proxy: Proxied) -> None:
    # The SDK stops at `[DONE]` and raises nothing: without the proxy nobody would notice.
    openai = pytest.importorskip("openai")
    proxy.serve(stream_handler(sse(chat_chunk(role="assistant", content=""), chat_chunk("Hel"), chat_chunk("lo"))))

    def run() -> str:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    assert await asyncio.to_thread(run) == "Hello"
    (record,) = await proxy.settled(1)
    assert record.error_type == "stream_incomplete"


async def test_the_simulators_unfinished_and_empty_streams_are_incomplete_through_the_proxy(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with sim_running(SimSettings(port=0, time_scale=0.1)) as sim:
        async with start_proxy(upstream=sim.url) as p:
            n = 0
            bodies: list[tuple[str, dict[str, Any]]] = [
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                ("/v1/completions", {"prompt": "hi"}),
                ("/v1/responses", {"input": "hi"}),
                ("/v1/messages", {"max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}),
            ]
            for path, body in bodies:
                for case in ("unfinished", "empty", None):
                    headers = {"x-sim-fail": case} if case else {}
                    payload = {"model": "gpt-4o-mini", "stream": True, **body}
                    async with client.post(p.url + path, json=payload, headers=headers) as r:
                        assert r.status == 200
                        await r.read()
                    n += 1
                    record = (await p.settled(n))[-1]
                    assert record.error_type == ("" if case is None else "stream_incomplete"), (path, case)
