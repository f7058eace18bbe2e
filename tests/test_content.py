"""Captured prompts and answers in the shape the GenAI conventions give them (and trace viewers
validate): for chat, legacy completions, Responses and Anthropic messages, streamed and whole,
with tool calls and tool results; bounded, marked when cut, never carrying a URL's query or an
image's bytes. The end-to-end test reads them back from a real OTLP receiver, in one process and
with two workers.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import aiohttp
import pytest

from proxy.dialects import API_CHAT, API_COMPLETIONS, API_MESSAGES, API_RESPONSES, DIALECTS
from proxy.dialects.content import CONTENT_LIMIT, TRUNCATED, Output, bounded_json, bounded_text
from proxy.dialects.sse import SSEEvent
from tests.fakes import FakeUpstream, OTLPSink, chat_chunk, json_handler, named, sse, stream_handler
from tests.test_semconv import attrs, proxied, scopes

MODES = ["one", pytest.param("workers", marks=pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT"))]
PART_FIELDS = {
    "text": {"content"},
    "reasoning": {"content"},
    "tool_call": {"id", "name", "arguments"},
    "tool_call_response": {"id", "response"},
    "uri": {"modality", "uri"},
}


def check_messages(messages: Any, output: bool = False) -> None:
    """The conventions' message shape: role, parts (each with its type's fields), and for an
    answer a finish reason."""
    assert isinstance(messages, list) and messages
    for m in messages:
        assert isinstance(m["role"], str) and isinstance(m["parts"], list), m
        assert set(m) == ({"role", "parts", "finish_reason"} if output else {"role", "parts"}), m
        if output:
            assert isinstance(m["finish_reason"], str)
        check_parts(m["parts"])


def check_parts(parts: Any) -> None:
    for p in parts:
        assert isinstance(p["type"], str), p
        assert set(p) - {"type"} == PART_FIELDS.get(p["type"], set()), p
        if p["type"] in ("text", "reasoning"):
            assert isinstance(p["content"], str)


def shaped(api: str, body: dict[str, Any]) -> tuple[Any, Any]:
    dialect = DIALECTS.get(api)
    assert dialect is not None
    info = dialect.inspect(json.dumps(body).encode(), capture_content=True)
    return (
        None if info.input_messages is None else json.loads(info.input_messages),
        None if info.system_instructions is None else json.loads(info.system_instructions),
    )


def streamed(api: str, frames: list[tuple[str, Any]]) -> Any:
    dialect = DIALECTS.get(api)
    assert dialect is not None
    reader = dialect.stream_reader(capture_content=True)
    for event, obj in frames:
        reader.feed(SSEEvent(event=event, data=json.dumps(obj).encode()))
    return None if reader.output_messages is None else json.loads(reader.output_messages)


def whole(api: str, body: Any) -> Any:
    dialect = DIALECTS.get(api)
    assert dialect is not None
    out = dialect.read_body(json.dumps(body).encode(), capture_content=True).output_messages
    return None if out is None else json.loads(out)


CHAT_REQUEST = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "weather?"},
                                     {"type": "image_url", "image_url": {"url": "https://img.example/a.png?sig=SECRET"}},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
    ],
}  # fmt: skip


def test_chat_request() -> None:
    messages, system = shaped(API_CHAT, CHAT_REQUEST)
    check_messages(messages)
    assert system is None  # chat's system messages are part of its history
    assert messages == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [
            {"type": "text", "content": "weather?"},
            {"type": "uri", "modality": "image", "uri": "https://img.example/a.png"},
            {"type": "image_url"},
        ]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "weather", "arguments": {"city": "Oslo"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": "rain"}]},
    ]  # fmt: skip
    assert "SECRET" not in json.dumps(messages) and "AAAA" not in json.dumps(messages)


def test_chat_stream_with_text_reasoning_and_tool_calls() -> None:
    frames = [
        ("message", chat_chunk(role="assistant", content="")),
        ("message", chat_chunk(reasoning_content="think")),
        ("message", chat_chunk("Let me check.")),
        ("message", chat_chunk(tool_calls=[{"index": 0, "id": "call_9", "type": "function",
                                            "function": {"name": "weather", "arguments": ""}}])),
        ("message", chat_chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"city":'}}])),
        ("message", chat_chunk(tool_calls=[{"index": 0, "function": {"arguments": '"Oslo"}'}}])),
        ("message", chat_chunk(finish="tool_calls")),
    ]  # fmt: skip
    out = streamed(API_CHAT, frames)
    check_messages(out, output=True)
    assert out == [{"role": "assistant", "finish_reason": "tool_call", "parts": [
        {"type": "reasoning", "content": "think"},
        {"type": "text", "content": "Let me check."},
        {"type": "tool_call", "id": "call_9", "name": "weather", "arguments": {"city": "Oslo"}},
    ]}]  # fmt: skip


def test_chat_whole_answer_and_several_choices() -> None:
    body = {
        "id": "c", "model": "m",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "A"}},
            {"index": 1, "finish_reason": "length", "message": {"role": "assistant", "content": "B"}},
        ],
    }  # fmt: skip
    out = whole(API_CHAT, body)
    check_messages(out, output=True)
    assert [(m["parts"][0]["content"], m["finish_reason"]) for m in out] == [("A", "stop"), ("B", "length")]


def test_completions_prompt_and_answer() -> None:
    messages, _ = shaped(API_COMPLETIONS, {"model": "m", "prompt": ["one", "two"]})
    assert messages == [
        {"role": "user", "parts": [{"type": "text", "content": "one"}]},
        {"role": "user", "parts": [{"type": "text", "content": "two"}]},
    ]
    out = whole(API_COMPLETIONS, {"choices": [{"index": 0, "text": "three", "finish_reason": "stop"}]})
    assert out == [{"role": "assistant", "parts": [{"type": "text", "content": "three"}], "finish_reason": "stop"}]


def test_responses_request_and_answer() -> None:
    request = {
        "model": "m", "instructions": "be brief",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
        ],
    }  # fmt: skip
    messages, system = shaped(API_RESPONSES, request)
    check_messages(messages)
    assert system == [{"type": "text", "content": "be brief"}]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["parts"][0]["arguments"] == {"city": "Oslo"}
    assert shaped(API_RESPONSES, {"model": "m", "input": "hi"}) == (
        [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}],
        None,
    )
    completed = {
        "type": "response.completed",
        "response": {"id": "r", "model": "m", "status": "completed", "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": '{"city":"Bergen"}'},
        ]},
    }  # fmt: skip
    frames = [
        ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Checking."}),
        ("response.completed", completed),
    ]
    out = streamed(API_RESPONSES, frames)
    check_messages(out, output=True)
    assert out == [{"role": "assistant", "finish_reason": "tool_call", "parts": [
        {"type": "reasoning", "content": "hmm"},
        {"type": "text", "content": "Checking."},
        {"type": "tool_call", "id": "call_2", "name": "weather", "arguments": {"city": "Bergen"}},
    ]}]  # fmt: skip
    assert whole(API_RESPONSES, completed["response"]) == out
    # a stream cut before its end keeps the text it had
    cut = streamed(API_RESPONSES, frames[:1])
    assert cut == [{"role": "assistant", "parts": [{"type": "text", "content": "Checking."}], "finish_reason": "stop"}]


def test_anthropic_request_stream_and_whole() -> None:
    request = {
        "model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "weather", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": [{"type": "text", "text": "rain"}]},
                                         {"type": "image", "source": {"type": "base64", "data": "AAAA"}}]},
        ],
    }  # fmt: skip
    messages, system = shaped(API_MESSAGES, request)
    check_messages(messages)
    assert system == [{"type": "text", "content": "be brief"}]
    assert messages[1]["parts"] == [
        {"type": "tool_call", "id": "tu_1", "name": "weather", "arguments": {"city": "Oslo"}}
    ]
    assert messages[2]["parts"] == [{"type": "tool_call_response", "id": "tu_1", "response": "rain"}, {"type": "image"}]
    assert shaped(API_MESSAGES, {"model": "m", "system": "s", "messages": []})[1] == [{"type": "text", "content": "s"}]

    frames = [
        ("message_start", {"type": "message_start", "message": {"id": "msg", "model": "m", "usage": {"input_tokens": 3}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
        ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Checking."}}),
        ("content_block_start", {"type": "content_block_start", "index": 2,
                                 "content_block": {"type": "tool_use", "id": "tu_2", "name": "weather", "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"city": '}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '"Bergen"}'}}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    expected = [{"role": "assistant", "finish_reason": "tool_call", "parts": [
        {"type": "reasoning", "content": "hmm"},
        {"type": "text", "content": "Checking."},
        {"type": "tool_call", "id": "tu_2", "name": "weather", "arguments": {"city": "Bergen"}},
    ]}]  # fmt: skip
    out = streamed(API_MESSAGES, frames)
    check_messages(out, output=True)
    assert out == expected
    body = {
        "id": "msg", "type": "message", "model": "m", "role": "assistant", "stop_reason": "tool_use",
        "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "tu_2", "name": "weather", "input": {"city": "Bergen"}}],
    }  # fmt: skip
    assert whole(API_MESSAGES, body) == expected


def test_nothing_is_kept_without_capture() -> None:
    dialect = DIALECTS.get(API_CHAT)
    assert dialect is not None
    reader = dialect.stream_reader(capture_content=False)
    reader.feed(SSEEvent(event="message", data=json.dumps(chat_chunk("secret")).encode()))
    assert reader.out is None and reader.output_messages is None and reader.text is None
    info = dialect.inspect(json.dumps(CHAT_REQUEST).encode())
    assert info.input_messages is None and info.system_instructions is None


def test_bounded_json_stays_valid_and_marks_the_cut() -> None:
    long = [{"role": "user", "parts": [{"type": "text", "content": "x" * 200_000}]}]
    text = bounded_json(long)
    assert len(text) <= CONTENT_LIMIT
    (message,) = json.loads(text)
    assert message["parts"][0]["content"].endswith(TRUNCATED)
    # 130 KB of JSON, twice the cap: the strings cannot shrink, so the oldest messages go
    many = [{"role": "user", "parts": [{"type": "text", "content": f"m{i}"}]} for i in range(2_000)]
    text = bounded_json(many)
    kept = json.loads(text)
    assert len(text) <= CONTENT_LIMIT and kept[0]["parts"][0]["content"].endswith(TRUNCATED)
    assert kept[-1]["parts"][0]["content"] == "m1999"  # the latest messages are the ones kept
    small = [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]
    assert json.loads(bounded_json(small)) == small


def test_a_long_answer_is_kept_up_to_the_cap_and_marked() -> None:
    out = Output(limit=100)
    for _ in range(50):
        out.text("abcdefghij")
    (message,) = out.messages()
    assert message["parts"][0]["content"].endswith(TRUNCATED)
    assert len(message["parts"][0]["content"]) <= 110 + len(TRUNCATED)


# --- --capture-io-values: the plain input.value and output.value --------------------------------


def input_value(api: str, body: dict[str, Any], *, capture: bool = True, io_values: bool = True) -> str | None:
    dialect = DIALECTS.get(api)
    assert dialect is not None
    return dialect.inspect(json.dumps(body).encode(), capture_content=capture, io_values=io_values).input_value


def output_value(api: str, *, frames: list[tuple[str, Any]] | None = None, body: Any = None) -> str | None:
    dialect = DIALECTS.get(api)
    assert dialect is not None
    if frames is None:
        return dialect.read_body(json.dumps(body).encode(), capture_content=True).output_value
    reader = dialect.stream_reader(capture_content=True)
    for event, obj in frames:
        reader.feed(SSEEvent(event=event, data=json.dumps(obj).encode()))
    return reader.output_value


def test_input_value_is_the_last_user_messages_text_in_every_dialect() -> None:
    chat = {"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": [{"type": "text", "text": "look:"},
                                     {"type": "image_url", "image_url": {"url": "https://img.example/a.png?sig=SECRET"}},
                                     {"type": "text", "text": "what is it?"}]},
    ]}  # fmt: skip
    assert input_value(API_CHAT, chat) == "look:\nwhat is it?"  # its text parts, one a line; no image URL
    assert input_value(API_CHAT, CHAT_REQUEST) == "weather?"  # a tool's result is not the user's
    assert input_value(API_COMPLETIONS, {"model": "m", "prompt": "once upon"}) == "once upon"
    assert input_value(API_COMPLETIONS, {"model": "m", "prompt": ["one", "two"]}) == "two"
    assert input_value(API_RESPONSES, {"model": "m", "instructions": "terse", "input": "hi"}) == "hi"
    items = {"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
    ]}  # fmt: skip
    assert input_value(API_RESPONSES, items) == "weather?"
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "rain"}]},
    ]
    anthropic = {"model": "m", "max_tokens": 9, "system": "be brief", "messages": turns}
    assert input_value(API_MESSAGES, anthropic) == "weather?"  # a turn of tool results: the question before it
    turns.append({"role": "user", "content": [{"type": "text", "text": "and tomorrow?"}]})
    assert input_value(API_MESSAGES, anthropic) == "and tomorrow?"
    # None: no user text; not asked for; no capture (then nothing at all is read)
    assert input_value(API_CHAT, {"model": "m", "messages": [{"role": "system", "content": "s"}]}) is None
    assert input_value(API_CHAT, chat, io_values=False) is None
    assert input_value(API_CHAT, chat, capture=False) is None


def test_output_value_is_the_answers_text_else_its_reasoning() -> None:
    chat_frames = [
        ("message", chat_chunk(role="assistant", content="")),
        ("message", chat_chunk(reasoning_content="think")),
        ("message", chat_chunk("Let me ")),
        ("message", chat_chunk("check.")),
        ("message", chat_chunk(finish="stop")),
    ]
    assert output_value(API_CHAT, frames=chat_frames) == "Let me check."  # the deltas joined; no reasoning
    assert output_value(API_CHAT, frames=chat_frames[:2]) == "think"  # no text (yet): the reasoning
    calls_only = [("message", chat_chunk(tool_calls=[{"index": 0, "id": "c", "type": "function",
                                                     "function": {"name": "f", "arguments": "{}"}}]))]  # fmt: skip
    assert output_value(API_CHAT, frames=calls_only) is None  # only a tool call: in gen_ai.output.messages
    two_choices = {"choices": [
        {"index": 1, "finish_reason": "stop", "message": {"role": "assistant", "content": "B"}},
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "A"}},
    ]}  # fmt: skip
    assert output_value(API_CHAT, body=two_choices) == "A"  # the first choice
    refused = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": "No."}}]}
    assert output_value(API_CHAT, body=refused) == "No."
    assert output_value(API_COMPLETIONS, body={"choices": [{"index": 0, "text": "three"}]}) == "three"
    responses = {"id": "r", "model": "m", "status": "completed", "output": [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Fine."}]},
    ]}  # fmt: skip
    assert output_value(API_RESPONSES, body=responses) == "Fine."
    delta = ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Fi"})
    assert output_value(API_RESPONSES, frames=[delta]) == "Fi"  # a stream cut before its end keeps its text
    anthropic = {"id": "msg", "type": "message", "model": "m", "role": "assistant", "stop_reason": "end_turn",
                 "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Rain."}]}  # fmt: skip
    assert output_value(API_MESSAGES, body=anthropic) == "Rain."
    anthropic_stream = [
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Rain."}}),
    ]  # fmt: skip
    assert output_value(API_MESSAGES, frames=anthropic_stream) == "Rain."
    dialect = DIALECTS.get(API_CHAT)
    assert dialect is not None
    assert dialect.stream_reader(capture_content=False).output_value is None  # nothing kept without capture


def test_io_values_are_bounded_and_marked_when_cut() -> None:
    long = "x" * (CONTENT_LIMIT + 10_000)
    value = input_value(API_CHAT, {"model": "m", "messages": [{"role": "user", "content": long}]})
    assert value is not None and len(value) == CONTENT_LIMIT and value.endswith(TRUNCATED)
    assert value.startswith("x" * 1000)
    assert bounded_text("short") == "short" and bounded_text("abcdefghijklmnopqrstuvwxyz", 20) == "abcdefgh" + TRUNCATED
    out = Output(limit=100)
    for _ in range(50):
        out.text("abcdefghij")
    answer = out.answer()
    assert answer is not None and answer.endswith(TRUNCATED) and len(answer) <= 110 + len(TRUNCATED)
    big = Output()  # the reader's own cap: 64 KiB of text kept, the rest marked, all within the bound
    for _ in range(20):
        big.text("y" * 10_000)
    answer = big.answer()
    assert answer is not None and len(answer) <= CONTENT_LIMIT and answer.endswith(TRUNCATED)


def _upstream_by_path(upstream: FakeUpstream) -> None:
    chat = stream_handler(
        sse(
            chat_chunk(role="assistant", content=""),
            chat_chunk(tool_calls=[{"index": 0, "id": "call_1", "type": "function",
                                    "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}]),
            chat_chunk(finish="tool_calls"),
        )
    )  # fmt: skip
    messages = stream_handler(
        [
            named("message_start", {"type": "message_start", "message": {"id": "m", "model": "claude-x", "usage": {}}}),
            named("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            named("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}}),
            named("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}),
            named("message_stop", {"type": "message_stop"}),
        ]
    )  # fmt: skip
    responses = json_handler(
        {"id": "r", "object": "response", "model": "gpt-4o", "status": "completed",
         "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "fine"}]}]}
    )  # fmt: skip

    async def handler(request: Any) -> Any:
        if request.path.endswith("/messages"):
            return await messages(request)
        if request.path.endswith("/responses"):
            return await responses(request)
        return await chat(request)

    upstream.handler = handler


@pytest.mark.parametrize("mode", MODES)
async def test_viewers_get_the_conventions_shape_from_the_collector(
    mode: str, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    _upstream_by_path(upstream)
    sink = await OTLPSink().start()
    try:
        async with proxied(upstream, sink, mode, capture_content=True) as url:
            for path, body in (
                ("/v1/chat/completions", {**CHAT_REQUEST, "stream": True}),
                ("/v1/messages", {"model": "claude-x", "max_tokens": 5, "stream": True, "system": "be brief",
                                  "messages": [{"role": "user", "content": "hi"}]}),
                ("/v1/responses", {"model": "gpt-4o", "instructions": "terse", "input": "hi"}),
            ):  # fmt: skip
                async with client.post(url + path, json=body) as r:
                    await r.read()
        roots = {s.name: attrs(s) for _, s in scopes(sink.payloads, metrics=False) if not s.parent_span_id}
    finally:
        await sink.close()
    chat, anthropic, responses = roots["chat m"], roots["chat claude-x"], roots["chat gpt-4o"]
    for root in (chat, anthropic, responses):
        check_messages(json.loads(str(root["gen_ai.input.messages"])))
        check_messages(json.loads(str(root["gen_ai.output.messages"])), output=True)
    assert "gen_ai.system_instructions" not in chat
    assert json.loads(str(anthropic["gen_ai.system_instructions"])) == [{"type": "text", "content": "be brief"}]
    assert json.loads(str(responses["gen_ai.system_instructions"])) == [{"type": "text", "content": "terse"}]
    assert json.loads(str(chat["gen_ai.output.messages"]))[0]["parts"] == [
        {"type": "tool_call", "id": "call_1", "name": "weather", "arguments": {"city": "Oslo"}}
    ]
    assert json.loads(str(anthropic["gen_ai.output.messages"]))[0]["parts"] == [{"type": "text", "content": "ok"}]
    assert json.loads(str(responses["gen_ai.output.messages"]))[0]["parts"] == [{"type": "text", "content": "fine"}]
    assert "SECRET" not in json.dumps(roots)
