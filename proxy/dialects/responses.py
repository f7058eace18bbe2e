"""OpenAI Responses: `event: response.*` + `data: {"type": ...}`; tokens in the `*.delta`
events; the end is `response.completed` | `incomplete` | `failed`, with usage in `response.usage`."""

from __future__ import annotations

from typing import Any

from proxy.dialects.content import Message, Output, Part, arguments, text_part, uri_part
from proxy.dialects.dialect import Dialect
from proxy.dialects.reader import (
    ANSWER,
    NOT_TOKEN,
    REASONING,
    StreamReader,
    items,
    nonempty,
    openai_output_type,
    openai_usage,
)
from proxy.dialects.sse import SSEEvent

__all__ = ["API_RESPONSES", "DIALECT", "ResponsesReader", "input_messages"]

API_RESPONSES = "responses"

_TOKENS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.audio.transcript.delta",
    }
)
# Of those, the model's reasoning: its raw text (open-weight models) and its summary (OpenAI's).
_REASONING = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})
_END = frozenset({"response.completed", "response.failed", "response.incomplete"})


class ResponsesReader(StreamReader):
    """OpenAI Responses: `event: response.*`; usage in the final `response.completed`."""

    __slots__ = ()

    def feed(self, event: SSEEvent) -> int:
        kind = event.event
        # Only deltas, the start, the end and errors carry anything we read.
        if kind != "message" and not (kind in _TOKENS or kind in _END or kind == "response.created" or kind == "error"):
            return NOT_TOKEN
        return super().feed(event)

    def _read(self, kind: str, obj: dict[str, Any]) -> int:
        typ = obj.get("type")
        if isinstance(typ, str):
            kind = typ
        if kind in _TOKENS:
            delta = obj.get("delta")
            if kind == "response.output_text.delta":
                self._keep(delta)
            if not nonempty(delta):
                return NOT_TOKEN
            return REASONING if kind in _REASONING else ANSWER
        if kind == "error":
            self.error_type = "stream_error"
            return NOT_TOKEN
        if kind in _END:
            self.done = True
            if kind == "response.failed":
                self.error_type = "stream_error"
        response = obj.get("response")
        if not isinstance(response, dict):
            return NOT_TOKEN
        self._meta(response)
        if kind in _END:
            self.usage = openai_usage(response.get("usage")) or self.usage
            status = response.get("status")
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            self._finish(reason or status)
            if self.out is not None:
                self._output(response, reason or status)
        return NOT_TOKEN

    def _read_whole(self, obj: dict[str, Any]) -> None:
        self._meta(obj)
        self.usage = openai_usage(obj.get("usage"))
        self._finish(obj.get("status"))
        if self.out is not None:
            details = obj.get("incomplete_details")
            self._output(obj, (details.get("reason") if isinstance(details, dict) else None) or obj.get("status"))

    def _output(self, response: dict[str, Any], reason: object) -> None:
        """The final response's `output` items, when it has them, replace the deltas kept so far
        (they hold the tool calls whole); only with capture on."""
        output = [item for item in items(response.get("output")) if isinstance(item, dict)]
        if not output:
            if self.out is not None:
                self.out.finish(reason)
            return
        out = self.out = Output(self.MAX_CAPTURE)
        calls = False
        for i, item in enumerate(output):
            kind = item.get("type")
            if kind == "message":
                for part in items(item.get("content")):
                    if isinstance(part, dict):
                        out.text(part.get("text") if part.get("type") == "output_text" else part.get("refusal"))
            elif kind == "reasoning":
                for summary in items(item.get("summary")):
                    if isinstance(summary, dict):
                        out.text(summary.get("text"), 0, "reasoning")
            elif kind == "function_call":
                calls = True
                out.tool_call(i, item.get("call_id"), item.get("name"), item.get("arguments"))
        out.finish("tool_calls" if calls and reason == "completed" else reason)


def _parts(content: object) -> list[Part]:
    """An input item's `content`: a string, or input/output text and image parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    parts: list[Part] = []
    for item in items(content):
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind in ("input_text", "output_text"):
            part = text_part(item.get("text"))
        elif kind == "input_image":
            part = uri_part(item.get("image_url"), "image") or {"type": "input_image"}
        else:
            part = {"type": kind} if isinstance(kind, str) else None  # files, audio: named, not copied
        if part is not None:
            parts.append(part)
    return parts


def input_messages(obj: dict[str, Any]) -> tuple[list[Message], list[Part] | None]:
    """`input` (a string or items) as input messages; `instructions` as the system instructions."""
    instructions = text_part(obj.get("instructions"))
    given = obj.get("input")
    if isinstance(given, str):
        return [{"role": "user", "parts": [{"type": "text", "content": given}]}], [
            instructions
        ] if instructions else None
    messages: list[Message] = []
    for item in items(given):
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call":
            call = {
                "type": "tool_call",
                "id": item.get("call_id"),
                "name": item.get("name"),
                "arguments": arguments(item.get("arguments")),
            }
            messages.append({"role": "assistant", "parts": [call]})
        elif kind == "function_call_output":
            result = {"type": "tool_call_response", "id": item.get("call_id"), "response": item.get("output")}
            messages.append({"role": "tool", "parts": [result]})
        elif isinstance(item.get("role"), str):
            messages.append({"role": item["role"], "parts": _parts(item.get("content"))})
    return messages, [instructions] if instructions else None


def _output_type(obj: dict[str, Any]) -> str | None:
    """`gen_ai.output.type` from `text.format`: `json` or `text`."""
    text = obj.get("text")
    return openai_output_type(text.get("format") if isinstance(text, dict) else None)


DIALECT = Dialect(
    api=API_RESPONSES,
    path_suffix="/responses",
    operation="chat",
    provider="openai",
    reader=ResponsesReader,
    params=(
        ("temperature", "gen_ai.request.temperature", float),
        ("top_p", "gen_ai.request.top_p", float),
        ("max_output_tokens", "gen_ai.request.max_tokens", int),
    ),
    output_type=_output_type,
    input_messages=input_messages,
)
