"""OpenAI Responses: `event: response.*` + `data: {"type": ...}`; tokens in the `*.delta`
events; the end is `response.completed` | `incomplete` | `failed`, with usage in `response.usage`."""

from __future__ import annotations

from typing import Any

from proxy.dialects.dialect import Dialect
from proxy.dialects.reader import StreamReader, nonempty, openai_usage
from proxy.sse import SSEEvent

__all__ = ["API_RESPONSES", "DIALECT", "ResponsesReader"]

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
_END = frozenset({"response.completed", "response.failed", "response.incomplete"})


class ResponsesReader(StreamReader):
    """OpenAI Responses: `event: response.*`; usage in the final `response.completed`."""

    __slots__ = ()

    def feed(self, event: SSEEvent) -> bool:
        kind = event.event
        # Only deltas, the start, the end and errors carry anything we read.
        if kind != "message" and not (kind in _TOKENS or kind in _END or kind == "response.created" or kind == "error"):
            return False
        return super().feed(event)

    def _read(self, kind: str, obj: dict[str, Any]) -> bool:
        typ = obj.get("type")
        if isinstance(typ, str):
            kind = typ
        if kind in _TOKENS:
            delta = obj.get("delta")
            if kind == "response.output_text.delta":
                self._keep(delta)
            return nonempty(delta)
        if kind == "error":
            self.error_type = "stream_error"
            return False
        if kind in _END:
            self.done = True
            if kind == "response.failed":
                self.error_type = "stream_error"
        response = obj.get("response")
        if not isinstance(response, dict):
            return False
        self._meta(response)
        if kind in _END:
            self.usage = openai_usage(response.get("usage")) or self.usage
            status = response.get("status")
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            self._finish(reason or status)
        return False

    def _read_whole(self, obj: dict[str, Any]) -> None:
        self._meta(obj)
        self.usage = openai_usage(obj.get("usage"))
        self._finish(obj.get("status"))


def _output_type(obj: dict[str, Any]) -> str | None:
    """`gen_ai.output.type` from `text.format`: `json` or `text`."""
    text = obj.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("json_object", "json_schema"):
        return "json"
    return "text" if kind == "text" else None


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
)
