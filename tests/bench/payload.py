"""The deterministic streams the bench upstream sends and the client expects.

Shared by `upstream.py` (which writes them) and `client.py` (which checks bytes against them), so
a byte-exact check needs no copy of the body on the wire. Every request for the same
(api, model, n_tokens) gets the same bytes. Chat completions' chunk JSON is what OpenAI/vLLM
send; `stream_parts` gives the other dialects' layouts too (legacy completions, the Responses
API, Anthropic messages), each as (events sent with the head, one event per token, the tail).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from functools import lru_cache
from typing import Any

import orjson

CREATED = 1_764_633_600
FINGERPRINT = "fp_bench"


def _chunk(model: str, delta: dict[str, object], finish: str | None) -> bytes:
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


def token_text(i: int) -> str:
    """The i-th token (0-based): short words, like real decoding."""
    return f" tok{i}"


@lru_cache(maxsize=64)
def stream_events(model: str, n_tokens: int, prompt_tokens: int = 12) -> tuple[bytes, ...]:
    """Every SSE event of one stream, in order.

    Layout: [role chunk] + n token chunks + [finish chunk, usage chunk, `[DONE]`]. The role
    chunk is sent with the headers (first byte), tokens are paced, the tail follows the last.
    """
    head = _chunk(model, {"role": "assistant", "content": ""}, None)
    tokens = [_chunk(model, {"content": token_text(i)}, None) for i in range(n_tokens)]
    finish = _chunk(model, {}, "stop")
    usage = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n_tokens,
            "total_tokens": prompt_tokens + n_tokens,
        },
    }
    tail = [finish, b"data: " + orjson.dumps(usage) + b"\n\n", b"data: [DONE]\n\n"]
    return (head, *tokens, *tail)


def _sse(event: str, body: dict[str, object]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"


def _completions_parts(model: str, n_tokens: int, prompt_tokens: int) -> Parts:
    def chunk(text: str, finish: str | None) -> bytes:
        body = {
            "id": "cmpl-bench",
            "object": "text_completion",
            "created": CREATED,
            "model": model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
        }
        return b"data: " + orjson.dumps(body) + b"\n\n"

    usage = {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": CREATED,
        "model": model,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n_tokens,
            "total_tokens": prompt_tokens + n_tokens,
        },
    }
    # No role chunk in this dialect: an SSE comment is the first byte, as some servers send.
    head = (b": ok\n\n",)
    tokens = tuple(chunk(token_text(i), None) for i in range(n_tokens))
    tail = (chunk("", "stop"), b"data: " + orjson.dumps(usage) + b"\n\n", b"data: [DONE]\n\n")
    return head, tokens, tail


def _responses_parts(model: str, n_tokens: int, prompt_tokens: int) -> Parts:
    rid, mid = "resp_bench", "msg_bench"
    response: dict[str, object] = {"id": rid, "object": "response", "created_at": CREATED, "model": model}
    item = {"id": mid, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    text = "".join(token_text(i) for i in range(n_tokens))
    part = {"type": "output_text", "text": "", "annotations": []}
    head = (
        _sse("response.created", {"type": "response.created", "response": {**response, "status": "in_progress"}}),
        _sse(
            "response.in_progress", {"type": "response.in_progress", "response": {**response, "status": "in_progress"}}
        ),
        _sse("response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": item}),
        _sse(
            "response.content_part.added",
            {
                "type": "response.content_part.added",
                "item_id": mid,
                "output_index": 0,
                "content_index": 0,
                "part": part,
            },
        ),
    )
    tokens = tuple(
        _sse(
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "item_id": mid,
                "output_index": 0,
                "content_index": 0,
                "delta": token_text(i),
            },
        )
        for i in range(n_tokens)
    )
    done_part = {**part, "text": text}
    done_item = {**item, "status": "completed", "content": [done_part]}
    usage = {"input_tokens": prompt_tokens, "output_tokens": n_tokens, "total_tokens": prompt_tokens + n_tokens}
    tail = (
        _sse(
            "response.output_text.done",
            {"type": "response.output_text.done", "item_id": mid, "output_index": 0, "content_index": 0, "text": text},
        ),
        _sse(
            "response.content_part.done",
            {
                "type": "response.content_part.done",
                "item_id": mid,
                "output_index": 0,
                "content_index": 0,
                "part": done_part,
            },
        ),
        _sse("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": done_item}),
        _sse(
            "response.completed",
            {
                "type": "response.completed",
                "response": {**response, "status": "completed", "output": [done_item], "usage": usage},
            },
        ),
    )
    return head, tokens, tail


def _messages_parts(model: str, n_tokens: int, prompt_tokens: int) -> Parts:
    message: dict[str, object] = {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 1},
    }
    head = (
        _sse("message_start", {"type": "message_start", "message": message}),
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
    )
    tokens = tuple(
        _sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": token_text(i)}},
        )
        for i in range(n_tokens)
    )
    tail = (
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": n_tokens},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    )
    return head, tokens, tail


Parts = tuple[tuple[bytes, ...], tuple[bytes, ...], tuple[bytes, ...]]
APIS = ("chat_completions", "completions", "responses", "messages")
PATHS = {
    "chat_completions": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}


def api_for_path(path: str) -> str | None:
    """The dialect a request path asks for (the proxy's own rule: by the path's end)."""
    for api, suffix in (
        ("chat_completions", "/chat/completions"),
        ("completions", "/completions"),
        ("responses", "/responses"),
        ("messages", "/messages"),
    ):
        if path.endswith(suffix):
            return api
    return None


@lru_cache(maxsize=64)
def stream_parts(api: str, model: str, n_tokens: int, prompt_tokens: int = 12) -> Parts:
    """One stream of dialect `api`: (events sent with the head, one event per token, the tail)."""
    if api == "chat_completions":
        events = stream_events(model, n_tokens, prompt_tokens)
        return events[:1], events[1 : 1 + n_tokens], events[1 + n_tokens :]
    if api == "completions":
        return _completions_parts(model, n_tokens, prompt_tokens)
    if api == "responses":
        return _responses_parts(model, n_tokens, prompt_tokens)
    if api == "messages":
        return _messages_parts(model, n_tokens, prompt_tokens)
    raise ValueError(f"unknown api {api!r}")


@lru_cache(maxsize=64)
def expected_body(model: str, n_tokens: int) -> bytes:
    """The whole body a byte-exact proxy must deliver."""
    return b"".join(stream_events(model, n_tokens))


@lru_cache(maxsize=64)
def expected_text(n_tokens: int) -> str:
    """The concatenated completion text (for proxies that re-serialise chunks)."""
    return "".join(token_text(i) for i in range(n_tokens))


def run(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run on uvloop (a project dependency) when it is there."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(main)
    else:
        uvloop.run(main)
