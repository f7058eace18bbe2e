"""OpenAI chat completions and legacy completions: `data: {chunk}` ... `data: [DONE]`.

Chat streams a role-only first chunk, then one chunk per token (`content`, or
`reasoning_content` for a reasoning model, none for one whose reasoning is hidden: it only
shows in the usage's `reasoning_tokens`), a chunk with `finish_reason`, and with
`stream_options.include_usage` a last chunk with `choices: []` and `usage` (every earlier
chunk then carries `"usage": null`, as OpenAI's do). Legacy completions stream `choices[].text`
and never show reasoning (it is generated, counted and billed, but hidden).
"""

from __future__ import annotations

from typing import Any

from proxy.sim.errors import SimError, error_body
from proxy.sim.wire import Meta, SimUsage, data_line

__all__ = ["ChatWriter", "CompletionsWriter", "openai_usage"]

DONE = b"data: [DONE]\n\n"
FINGERPRINT = "fp_taotrace_sim"


def openai_usage(usage: SimUsage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


class ChatWriter:
    """`chat.completion.chunk` stream / `chat.completion` body."""

    object_chunk = "chat.completion.chunk"

    def __init__(self, meta: Meta) -> None:
        self.meta = meta
        self._reasoning = len(meta.output.reasoning)

    def _chunk(self, choices: list[dict[str, Any]]) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.meta.id,
            "object": self.object_chunk,
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        }
        if self.meta.include_usage:
            chunk["usage"] = None
        return data_line(chunk)

    def _choice(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def start(self, usage: SimUsage) -> bytes:
        return self._chunk([self._choice({"role": "assistant", "content": "", "refusal": None})])

    def token(self, index: int) -> bytes:
        out = self.meta.output
        if index < self._reasoning:
            return b"" if out.hidden else self._chunk([self._choice({"reasoning_content": out.reasoning[index]})])
        return self._chunk([self._choice({"content": out.answer[index - self._reasoning]})])

    def end(self, usage: SimUsage) -> bytes:
        tail = self._chunk([self._choice({}, self.meta.output.finish)])
        if self.meta.include_usage:
            tail += data_line(
                {
                    "id": self.meta.id,
                    "object": self.object_chunk,
                    "created": self.meta.created,
                    "model": self.meta.model,
                    "system_fingerprint": FINGERPRINT,
                    "choices": [],
                    "usage": openai_usage(usage),
                }
            )
        return tail + DONE

    def error(self, error: SimError) -> bytes:
        return data_line(error_body("chat_completions", error))

    def interrupted(self) -> bytes:
        """`data: [DONE]` without a finish reason, as a real engine interrupting a generation sends."""
        return DONE

    def body(self, usage: SimUsage) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.meta.output.text, "refusal": None}
        if self._reasoning and not self.meta.output.hidden:
            message["reasoning_content"] = self.meta.output.reasoning_text
        return {
            "id": self.meta.id,
            "object": "chat.completion",
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self.meta.output.finish}],
            "usage": openai_usage(usage),
        }


class CompletionsWriter(ChatWriter):
    """Legacy `text_completion`: `choices[].text`; no role chunk; reasoning hidden."""

    object_chunk = "text_completion"

    def _choice(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"text": delta.get("text", ""), "index": 0, "logprobs": None, "finish_reason": finish}

    def start(self, usage: SimUsage) -> bytes:
        return b""

    def token(self, index: int) -> bytes:
        if index < self._reasoning:
            return b""
        return self._chunk([self._choice({"text": self.meta.output.answer[index - self._reasoning]})])

    def body(self, usage: SimUsage) -> dict[str, Any]:
        return {
            "id": self.meta.id,
            "object": "text_completion",
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [self._choice({"text": self.meta.output.text}, self.meta.output.finish)],
            "usage": openai_usage(usage),
        }
