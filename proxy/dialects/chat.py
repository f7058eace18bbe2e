"""OpenAI chat completions: `data: {chat.completion.chunk}` … `data: [DONE]`; with
`stream_options.include_usage`, one usage-only chunk (`choices: []`) before `[DONE]`."""

from __future__ import annotations

from typing import Any

from proxy.dialects.dialect import COMMON_PARAMS, Dialect
from proxy.dialects.reader import StreamReader, items, loads, nonempty, openai_usage
from proxy.sse import SSEEvent

__all__ = ["API_CHAT", "DIALECT", "ChatReader"]

API_CHAT = "chat_completions"


class ChatReader(StreamReader):
    """`data: {chat.completion.chunk}` … `data: [DONE]`; legacy completions share the framing."""

    __slots__ = ()

    def feed(self, event: SSEEvent) -> bool:
        data = event.data
        if data == b"[DONE]":  # the comparison the base class made anyway: the terminal check is free
            self.done = True
            return False
        obj = loads(data)
        if not isinstance(obj, dict):
            return False
        return self._read(event.event, obj)

    def _read(self, kind: str, obj: dict[str, Any]) -> bool:
        if "error" in obj and obj["error"]:
            self.error_type = "stream_error"
            return False
        # This runs once per chunk: the calls below are skipped when they could change nothing.
        if self.response_id is None or self.response_model is None:
            self._meta(obj)
        usage = obj.get("usage")
        if usage:
            self.usage = openai_usage(usage) or self.usage
        token = False
        for choice in items(obj.get("choices")):
            if not isinstance(choice, dict):
                continue
            reason = choice.get("finish_reason")
            if reason:
                self._finish(reason)
            if self._choice_has_token(choice):
                token = True
        return token

    def _choice_has_token(self, choice: dict[str, Any]) -> bool:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return False
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._keep(content)
            return True  # the common chunk: the other fields cannot change the answer or the capture
        found = False
        for key in ("reasoning_content", "reasoning", "refusal"):
            if nonempty(delta.get(key)):
                found = True
        for call in items(delta.get("tool_calls")):
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and nonempty(fn.get("arguments")):
                found = True
        return found

    def _read_whole(self, obj: dict[str, Any]) -> None:
        self._meta(obj)
        self.usage = openai_usage(obj.get("usage"))
        for choice in items(obj.get("choices")):
            if isinstance(choice, dict):
                self._finish(choice.get("finish_reason"))
                message = choice.get("message")
                self._keep(message.get("content") if isinstance(message, dict) else choice.get("text"))


def _output_type(obj: dict[str, Any]) -> str | None:
    """`gen_ai.output.type` from `response_format`: `json` or `text`."""
    fmt = obj.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("json_object", "json_schema"):
        return "json"
    return "text" if kind == "text" else None


DIALECT = Dialect(
    api=API_CHAT,
    path_suffix="/chat/completions",
    operation="chat",
    provider="openai",
    reader=ChatReader,
    params=(
        *COMMON_PARAMS,
        ("max_completion_tokens", "gen_ai.request.max_tokens", int),
        ("max_tokens", "gen_ai.request.max_tokens", int),
        ("stop", "gen_ai.request.stop_sequences", list),
        ("n", "gen_ai.request.choice.count", int),
    ),
    output_type=_output_type,
)
