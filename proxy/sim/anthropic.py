"""Anthropic Messages: `message_start`, `content_block_start`, `ping`, `content_block_delta`...,
`content_block_stop`, `message_delta` (stop_reason, cumulative `usage.output_tokens`), `message_stop`.

A reasoning model opens with a `thinking` block (`thinking_delta`s, then a `signature_delta`)
before its `text` block; one whose reasoning is hidden, with a `redacted_thinking` block (its
opaque `data` whole in the block's start, no deltas) while it thinks. Usage follows Anthropic: `input_tokens` excludes cache reads, which are
`cache_read_input_tokens`. A mid-stream failure is `event: error` with an `overloaded_error`.
"""

from __future__ import annotations

from typing import Any

from proxy.sim.errors import SimError, error_body
from proxy.sim.wire import Meta, SimUsage, named_event, new_id

__all__ = ["MessagesWriter", "anthropic_usage"]

_STOP = {"stop": "end_turn", "length": "max_tokens"}


def anthropic_usage(usage: SimUsage, output_tokens: int | None = None) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.output_tokens if output_tokens is None else output_tokens,
    }


class MessagesWriter:
    """One `message`, streamed as events or returned whole."""

    def __init__(self, meta: Meta) -> None:
        self.meta = meta
        self._reasoning = len(meta.output.reasoning)
        self._block = -1
        self._signature = new_id("sig_", 48)
        self._redacted = new_id("", 64)  # a hidden reasoning's opaque data

    def _start_block(self, kind: str) -> bytes:
        self._block += 1
        block: dict[str, Any]
        if kind == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
            if self.meta.output.hidden:
                block = {"type": "redacted_thinking", "data": self._redacted}
        else:
            block = {"type": "text", "text": ""}
        return named_event(
            "content_block_start", {"type": "content_block_start", "index": self._block, "content_block": block}
        )

    def _stop_block(self) -> bytes:
        if self._block < 0:
            return b""
        head = b""
        if self._block == 0 and self._reasoning and not self.meta.output.hidden:
            head = named_event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "signature_delta", "signature": self._signature},
                },
            )
        return head + named_event("content_block_stop", {"type": "content_block_stop", "index": self._block})

    def _message(
        self, usage: SimUsage, content: list[dict[str, Any]], stop: str | None, output_tokens: int
    ) -> dict[str, Any]:
        return {
            "id": self.meta.id,
            "type": "message",
            "role": "assistant",
            "model": self.meta.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": anthropic_usage(usage, output_tokens),
        }

    def start(self, usage: SimUsage) -> bytes:
        first = "thinking" if self._reasoning else "text"
        return (
            named_event("message_start", {"type": "message_start", "message": self._message(usage, [], None, 1)})
            + self._start_block(first)
            + named_event("ping", {"type": "ping"})
        )

    def token(self, index: int) -> bytes:
        out = self.meta.output
        if index < self._reasoning:
            if out.hidden:
                return b""  # thinking inside the redacted block: nothing is streamed
            delta = {"type": "thinking_delta", "thinking": out.reasoning[index]}
            head = b""
        else:
            delta = {"type": "text_delta", "text": out.answer[index - self._reasoning]}
            head = (
                self._stop_block() + self._start_block("text") if index == self._reasoning and self._reasoning else b""
            )
        return head + named_event(
            "content_block_delta", {"type": "content_block_delta", "index": self._block, "delta": delta}
        )

    def end(self, usage: SimUsage) -> bytes:
        stop = _STOP[self.meta.output.finish]
        return (
            self._stop_block()
            + named_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": usage.output_tokens},
                },
            )
            + named_event("message_stop", {"type": "message_stop"})
        )

    def interrupted(self) -> bytes:
        """Nothing more: the body just ends."""
        return b""

    def error(self, error: SimError) -> bytes:
        return named_event("error", error_body("messages", error))

    def body(self, usage: SimUsage) -> dict[str, Any]:
        out = self.meta.output
        content: list[dict[str, Any]] = []
        if self._reasoning and out.hidden:
            content.append({"type": "redacted_thinking", "data": self._redacted})
        elif self._reasoning:
            content.append({"type": "thinking", "thinking": out.reasoning_text, "signature": self._signature})
        content.append({"type": "text", "text": out.text})
        return self._message(usage, content, _STOP[out.finish], usage.output_tokens)
