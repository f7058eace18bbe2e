"""Which events are tokens, and what usage says, for each of the four dialects."""

from __future__ import annotations

import json

import pytest

from proxy.dialects import (
    ANSWER,
    API_CHAT,
    API_COMPLETIONS,
    API_EMBEDDINGS,
    API_MESSAGES,
    API_OTHER,
    API_RESPONSES,
    NOT_TOKEN,
    REASONING,
    Usage,
    api_for_path,
    inspect_request,
    is_chunk,
    read_body,
    reader_for,
)
from proxy.dialects.sse import SSEEvent


def ev(obj: object, event: str = "message") -> SSEEvent:
    return SSEEvent(event, obj if isinstance(obj, bytes) else json.dumps(obj).encode())


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", API_CHAT),
        ("/api/v1/chat/completions/", API_CHAT),
        ("/v1/completions", API_COMPLETIONS),
        ("/v1/responses", API_RESPONSES),
        ("/v1/messages", API_MESSAGES),
        ("/v1/models", API_OTHER),
        ("/v1/embeddings", API_EMBEDDINGS),
        ("/", API_OTHER),
    ],
)
def test_api_for_path(path: str, api: str) -> None:
    assert api_for_path(path) == api


def test_inspect_request_reads_model_and_stream() -> None:
    info = inspect_request(API_CHAT, b'{"model":"gpt-4o","stream":true,"messages":[]}')
    assert (info.operation, info.provider, info.model, info.stream) == ("chat", "openai", "gpt-4o", True)
    assert inspect_request(API_MESSAGES, b'{"model":"claude","stream":false}').provider == "anthropic"
    assert inspect_request(API_COMPLETIONS, b'{"model":"m"}').operation == "text_completion"


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1,2]", b'{"messages":[]}', b'{"model": 42}', b'{"model":"' + b"x" * 10000 + b'"}', b""],
)
def test_inspect_request_degrades_without_error(body: bytes) -> None:
    info = inspect_request(API_CHAT, body)
    assert info.model is None and info.api == API_CHAT


def test_stream_of_the_wrong_type_is_not_a_stream() -> None:
    assert inspect_request(API_CHAT, b'{"model":"m","stream":"yes"}').stream is False


def test_prompt_text_captured_only_on_opt_in() -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"secret prompt"}]}'
    assert inspect_request(API_CHAT, body).content is None
    captured = inspect_request(API_CHAT, body, capture_content=True).content
    assert captured is not None and "secret prompt" in captured


def chunk(**delta: object) -> dict[str, object]:
    return {"id": "c1", "model": "gpt-x", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


@pytest.mark.parametrize(
    ("delta", "kind"),
    [
        ({"role": "assistant"}, NOT_TOKEN),
        ({"role": "assistant", "content": ""}, NOT_TOKEN),
        ({"content": None}, NOT_TOKEN),
        ({}, NOT_TOKEN),
        ({"content": "Hi"}, ANSWER),
        ({"reasoning_content": "think"}, REASONING),  # DeepSeek
        ({"reasoning": "think"}, REASONING),  # vLLM, OpenRouter
        ({"reasoning": "think", "content": ""}, REASONING),  # beside an empty content
        ({"reasoning_content": "think", "content": None}, REASONING),
        ({"reasoning": "", "content": "Hi"}, ANSWER),
        ({"reasoning": "think", "content": "Hi"}, ANSWER),  # both in one delta: the answer has begun
        ({"refusal": "no"}, ANSWER),
        ({"reasoning": "think", "refusal": "no"}, ANSWER),
        ({"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f", "arguments": ""}}]}, NOT_TOKEN),
        ({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}, ANSWER),
        ({"reasoning": "think", "tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}, ANSWER),
    ],
)
def test_chat_token_rules(delta: dict[str, object], kind: int) -> None:
    reader = reader_for(API_CHAT)
    assert reader is not None
    assert reader.feed(ev(chunk(**delta))) == kind


def test_chat_choices_answer_outweighs_reasoning() -> None:
    """n > 1: a chunk where one choice answers while another still thinks is an answer token."""
    reader = reader_for(API_CHAT)
    assert reader is not None
    thinking = {"index": 0, "delta": {"reasoning_content": "hm"}}
    answering = {"index": 1, "delta": {"content": "A"}}
    assert reader.feed(ev({"choices": [thinking, answering]})) == ANSWER
    assert reader.feed(ev({"choices": [answering, thinking]})) == ANSWER
    assert reader.feed(ev({"choices": [thinking, {"index": 1, "delta": {}}]})) == REASONING


def test_chat_usage_chunk_done_and_errors() -> None:
    reader = reader_for(API_CHAT)
    assert reader is not None
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 64},
        "completion_tokens_details": {"reasoning_tokens": 5},
    }
    final = {"id": "c1", "model": "gpt-x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    assert reader.feed(ev(final)) == NOT_TOKEN
    assert reader.feed(ev({"id": "c1", "choices": [], "usage": usage})) == NOT_TOKEN
    assert reader.feed(SSEEvent("message", b"[DONE]")) == NOT_TOKEN
    assert reader.feed(SSEEvent("message", b"{not json")) == NOT_TOKEN
    assert reader.usage == Usage(100, 20, 64, 5)
    assert reader.finish_reasons == ["stop"]
    assert (reader.response_id, reader.response_model) == ("c1", "gpt-x")
    assert reader.error_type is None
    assert reader.feed(ev({"error": {"message": "boom", "type": "server_error"}})) == NOT_TOKEN
    assert reader.error_type == "stream_error"


def test_legacy_completions_text() -> None:
    reader = reader_for(API_COMPLETIONS)
    assert reader is not None
    assert reader.feed(ev({"choices": [{"text": "Hello", "index": 0}]})) == ANSWER
    assert reader.feed(ev({"choices": [{"text": "", "index": 0, "finish_reason": "length"}]})) == NOT_TOKEN
    assert reader.finish_reasons == ["length"]


def test_responses_events() -> None:
    reader = reader_for(API_RESPONSES)
    assert reader is not None
    created = {"type": "response.created", "response": {"id": "resp_1", "model": "gpt-4o", "status": "in_progress"}}
    assert reader.feed(ev(created, "response.created")) == NOT_TOKEN
    for kind in ("response.in_progress", "response.output_item.added", "response.content_part.added"):
        assert reader.feed(ev({"type": kind}, kind)) == NOT_TOKEN
    for kind, token in (
        ("response.output_text.delta", ANSWER),
        ("response.reasoning_text.delta", REASONING),
        ("response.reasoning_summary_text.delta", REASONING),
        ("response.refusal.delta", ANSWER),
        ("response.function_call_arguments.delta", ANSWER),
    ):
        assert reader.feed(ev({"type": kind, "delta": "x"}, kind)) == token
        assert reader.feed(ev({"type": kind, "delta": "x"})) == token  # data-only: its type names it
    for kind in ("response.reasoning_summary_part.added", "response.reasoning_summary_text.done"):
        assert reader.feed(ev({"type": kind, "text": "x"}, kind)) == NOT_TOKEN
    assert reader.feed(ev({"type": "response.reasoning_text.delta", "delta": ""}, "response.reasoning_text.delta")) == 0
    assert (
        reader.feed(ev({"type": "response.output_text.delta", "delta": ""}, "response.output_text.delta")) == NOT_TOKEN
    )
    assert reader.feed(ev({"type": "response.output_text.done", "text": "x"}, "response.output_text.done")) == NOT_TOKEN
    done = {
        "type": "response.completed",
        "response": {
            "id": "resp_1",
            "model": "gpt-4o",
            "status": "completed",
            "usage": {
                "input_tokens": 50,
                "output_tokens": 9,
                "input_tokens_details": {"cached_tokens": 32},
                "output_tokens_details": {"reasoning_tokens": 3},
            },
        },
    }
    assert reader.feed(ev(done, "response.completed")) == NOT_TOKEN
    assert reader.usage == Usage(50, 9, 32, 3)
    assert (reader.response_id, reader.response_model, reader.finish_reasons) == ("resp_1", "gpt-4o", ["completed"])


def test_responses_failure_and_error_events() -> None:
    reader = reader_for(API_RESPONSES)
    assert reader is not None
    reader.feed(ev({"type": "response.failed", "response": {"id": "r", "status": "failed"}}, "response.failed"))
    assert reader.error_type == "stream_error"
    other = reader_for(API_RESPONSES)
    assert other is not None
    other.feed(ev({"type": "error", "code": "server_error", "message": "x"}, "error"))
    assert other.error_type == "stream_error"


def test_anthropic_messages_events() -> None:
    reader = reader_for(API_MESSAGES)
    assert reader is not None
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "model": "claude-x",
            "usage": {
                "input_tokens": 10,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 5,
                "output_tokens": 1,
            },
        },
    }
    assert reader.feed(ev(start, "message_start")) == NOT_TOKEN
    assert reader.feed(ev({"type": "ping"}, "ping")) == NOT_TOKEN
    assert (
        reader.feed(
            ev(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                "content_block_start",
            )
        )
        == NOT_TOKEN
    )
    for delta, token in (
        ({"type": "text_delta", "text": "Hi"}, ANSWER),
        ({"type": "thinking_delta", "thinking": "hm"}, REASONING),
        ({"type": "input_json_delta", "partial_json": "{"}, ANSWER),
    ):
        assert (
            reader.feed(ev({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta")) == token
        )
    redacted = {"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "x"}}
    assert reader.feed(ev(redacted, "content_block_start")) == NOT_TOKEN  # carries no text
    assert (
        reader.feed(
            ev(
                {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s"}},
                "content_block_delta",
            )
        )
        == NOT_TOKEN
    )
    assert reader.feed(ev({"type": "content_block_stop", "index": 0}, "content_block_stop")) == NOT_TOKEN
    assert (
        reader.feed(
            ev(
                {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 42}},
                "message_delta",
            )
        )
        == NOT_TOKEN
    )
    assert reader.feed(ev({"type": "message_stop"}, "message_stop")) == NOT_TOKEN
    # GenAI input tokens include cache reads and writes; both are also reported apart
    assert reader.usage == Usage(115, 42, 100, None, cache_creation_input_tokens=5)
    assert (reader.response_id, reader.response_model, reader.finish_reasons) == ("msg_1", "claude-x", ["end_turn"])
    reader.feed(ev({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "error"))
    assert reader.error_type == "stream_error"


def test_anthropic_stream_cut_before_message_delta_counts_its_tokens() -> None:
    """`message_start`'s `output_tokens` is a placeholder (1): a stream that ends before
    `message_delta` (the client broke off, the upstream cut it) reports the token events counted."""
    from proxy.exchange.record import usage_of

    reader = reader_for(API_MESSAGES)
    assert reader is not None
    start = {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 9, "output_tokens": 1}}}
    reader.feed(ev(start, "message_start"))
    for _ in range(4):
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}}
        assert reader.feed(ev(delta, "content_block_delta")) == ANSWER
    usage, source = usage_of(reader, True, 4)
    assert (usage.input_tokens, usage.output_tokens, source) == (9, 4, "counted")


def test_unknown_events_pass_quietly() -> None:
    for api in (API_CHAT, API_RESPONSES, API_MESSAGES):
        reader = reader_for(api)
        assert reader is not None
        assert reader.feed(ev({"type": "brand_new_event", "delta": "x"}, "brand_new_event")) == NOT_TOKEN


def test_non_streaming_bodies() -> None:
    chat = read_body(API_CHAT, json.dumps({
        "id": "c", "model": "m", "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }).encode())  # fmt: skip
    assert chat is not None and chat.usage == Usage(3, 1, None, None) and chat.finish_reasons == ["stop"]
    msg = read_body(API_MESSAGES, json.dumps({
        "id": "m", "model": "claude", "stop_reason": "end_turn", "content": [{"type": "text", "text": "x"}],
        "usage": {"input_tokens": 4, "output_tokens": 2, "cache_read_input_tokens": 6},
    }).encode())  # fmt: skip
    assert msg is not None and msg.usage == Usage(10, 2, 6, None)
    resp = read_body(
        API_RESPONSES,
        json.dumps(
            {"id": "r", "model": "m", "status": "completed", "usage": {"input_tokens": 1, "output_tokens": 2}}
        ).encode(),
    )
    assert resp is not None and resp.usage == Usage(1, 2, None, None)
    assert read_body(API_OTHER, b"{}") is None
    garbage = read_body(API_CHAT, b"<html>")
    assert garbage is not None and garbage.usage is None


@pytest.mark.parametrize(
    ("event", "chunk"),
    [
        (SSEEvent("message", b'{"choices":[{"delta":{"role":"assistant"}}]}'), True),  # role-only: a chunk, no token
        (SSEEvent("message", b'{"choices":[],"usage":{}}'), True),  # usage-only chunk
        (SSEEvent("message_start", b'{"type":"message_start"}'), True),
        (SSEEvent("message", b"[DONE]"), False),  # the SDKs stop here, yielding nothing
        (SSEEvent("ping", b'{"type":"ping"}'), False),  # the Anthropic SDK skips it
        (SSEEvent("message", b""), False),
    ],
)
def test_a_chunk_is_what_an_sdk_yields(event: SSEEvent, chunk: bool) -> None:
    assert is_chunk(event) is chunk


def test_request_parameters_as_genai_attributes() -> None:
    body = {
        "model": "m", "temperature": 0.2, "top_p": 1, "max_completion_tokens": 64, "max_tokens": 9,
        "frequency_penalty": 0.5, "presence_penalty": -1, "seed": 7, "stop": "END", "n": 2,
        "response_format": {"type": "json_schema"}, "messages": [{"role": "user", "content": "secret"}],
    }  # fmt: skip
    params = dict(inspect_request(API_CHAT, json.dumps(body).encode()).params)
    assert params == {
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.top_p": 1.0,
        "gen_ai.request.frequency_penalty": 0.5,
        "gen_ai.request.presence_penalty": -1.0,
        "gen_ai.request.seed": 7,
        "gen_ai.request.max_tokens": 64,  # max_completion_tokens wins over the deprecated max_tokens
        "gen_ai.request.stop_sequences": ("END",),
        "gen_ai.request.choice.count": 2,
        "gen_ai.output.type": "json",
    }
    assert isinstance(params["gen_ai.request.top_p"], float)
    anthropic = {"model": "c", "max_tokens": 5, "top_k": 40, "stop_sequences": ["a", "b"], "temperature": 1}
    assert dict(inspect_request(API_MESSAGES, json.dumps(anthropic).encode()).params) == {
        "gen_ai.request.temperature": 1.0,
        "gen_ai.request.top_k": 40.0,
        "gen_ai.request.max_tokens": 5,
        "gen_ai.request.stop_sequences": ("a", "b"),
    }
    responses = {"model": "m", "max_output_tokens": 100, "text": {"format": {"type": "text"}}}
    assert dict(inspect_request(API_RESPONSES, json.dumps(responses).encode()).params) == {
        "gen_ai.request.max_tokens": 100,
        "gen_ai.output.type": "text",
    }


def test_request_parameters_of_the_wrong_type_are_left_out() -> None:
    body = {
        "model": "m", "temperature": "hot", "top_p": True, "max_tokens": 1.5, "seed": 1 << 70,
        "stop": ["x" * 1000], "n": 1, "response_format": "json",
    }  # fmt: skip
    assert inspect_request(API_CHAT, json.dumps(body).encode()).params == ()


@pytest.mark.parametrize(
    ("api", "events", "terminal"),
    [
        (API_CHAT, [ev(chunk(content="hi")), ev({"choices": [], "usage": {"completion_tokens": 1}})], ev(b"[DONE]")),
        (API_COMPLETIONS, [ev({"choices": [{"text": "a"}]})], ev(b"[DONE]")),
        (API_RESPONSES, [ev({"type": "response.output_text.delta", "delta": "a"}, "response.output_text.delta")],
         ev({"type": "response.completed", "response": {"usage": {"output_tokens": 1}}}, "response.completed")),
        (API_RESPONSES, [], ev({"type": "response.incomplete", "response": {}}, "response.incomplete")),
        (API_RESPONSES, [], ev({"type": "response.completed", "response": {}})),  # data-only: the type names it
        (API_MESSAGES, [ev({"type": "content_block_delta", "delta": {"text": "a"}}, "content_block_delta"),
                        ev({"type": "message_delta", "usage": {"output_tokens": 1}}, "message_delta")],
         ev({"type": "message_stop"}, "message_stop")),
        (API_MESSAGES, [], ev({"type": "message_stop"})),  # data-only
    ],
)  # fmt: skip
def test_done_only_after_the_terminal_event(api: str, events: list[SSEEvent], terminal: SSEEvent) -> None:
    reader = reader_for(api)
    assert reader is not None
    for event in events:
        reader.feed(event)
        assert not reader.done
    assert reader.feed(terminal) == NOT_TOKEN  # never a token
    assert reader.done and reader.error_type is None


def test_response_failed_is_terminal_and_an_error() -> None:
    reader = reader_for(API_RESPONSES)
    assert reader is not None
    reader.feed(ev({"type": "response.failed", "response": {"status": "failed"}}, "response.failed"))
    assert reader.done and reader.error_type == "stream_error"


@pytest.mark.parametrize(
    ("api", "event"),
    [
        (API_CHAT, ev({"error": {"message": "x"}})),  # an error chunk is not the end
        (API_RESPONSES, ev({"type": "response.output_item.done"}, "response.output_item.done")),
        (API_RESPONSES, ev(b"[DONE]")),  # not this dialect's terminal event
        (API_MESSAGES, ev({"type": "content_block_stop"}, "content_block_stop")),
        (API_MESSAGES, ev({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}, "message_delta")),
    ],
)
def test_not_terminal(api: str, event: SSEEvent) -> None:
    reader = reader_for(api)
    assert reader is not None
    reader.feed(event)
    assert not reader.done
