"""The deterministic chat-completions stream the bench upstream sends and the client expects.

Shared by `upstream.py` (which writes it) and `client.py` (which checks bytes against it), so a
byte-exact check needs no copy of the body on the wire. Every request for the same
(model, n_tokens) gets the same bytes; the chunk JSON is what OpenAI/vLLM send.
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
