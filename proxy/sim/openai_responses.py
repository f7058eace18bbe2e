"""OpenAI Responses: `event: response.*` + `data: {"type": ..., "sequence_number": n, ...}`.

Order: `response.created`, `response.in_progress`; for a reasoning model a `reasoning` output
item (`output_item.added`, `content_part.added`, `response.reasoning_text.delta`...,
`reasoning_text.done`, `content_part.done`, `output_item.done`); then the `message` item the
same way with `response.output_text.delta`; then `response.completed` (or
`response.incomplete` when `max_output_tokens` cut it) carrying the usage with
`input_tokens_details.cached_tokens` and `output_tokens_details.reasoning_tokens`. A model whose
reasoning is hidden adds and ends its `reasoning` item with no content and no deltas (as OpenAI's
o-series without a summary): only `reasoning_tokens` says it thought.
A mid-stream failure is an `error` event.
"""

from __future__ import annotations

from typing import Any

from proxy.sim.errors import SimError
from proxy.sim.wire import Meta, SimUsage, named_event, new_id

__all__ = ["ResponsesWriter", "responses_usage"]


def responses_usage(usage: SimUsage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


class ResponsesWriter:
    """One `response` object, streamed as events or returned whole."""

    def __init__(self, meta: Meta) -> None:
        self.meta = meta
        self._seq = 0
        self._reasoning = len(meta.output.reasoning)
        self._rs_id = new_id("rs_", 32)
        self._msg_id = new_id("msg_", 32)
        self._open: str | None = None  # "reasoning" | "message"

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return named_event(kind, payload)

    def _response(self, status: str, output: list[dict[str, Any]], usage: SimUsage | None) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.meta.id,
            "object": "response",
            "created_at": self.meta.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": None,
            "max_output_tokens": self.meta.max_tokens,
            "model": self.meta.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": responses_usage(usage) if usage is not None else None,
            "user": None,
            "metadata": {},
        }

    def _reasoning_item(self, status: str, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [{"type": "reasoning_text", "text": text}]
        return {"id": self._rs_id, "type": "reasoning", "summary": [], "content": content, "status": status}

    def _message_item(self, status: str, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}]
        return {"id": self._msg_id, "type": "message", "status": status, "content": content, "role": "assistant"}

    def _output(self) -> list[dict[str, Any]]:
        out = self.meta.output
        text = None if out.hidden else out.reasoning_text
        items = [self._reasoning_item("completed", text)] if self._reasoning else []
        if out.answer:
            items.append(self._message_item("completed", out.text))
        return items

    def _index(self, kind: str) -> int:
        return 1 if kind == "message" and self._reasoning else 0

    def _open_item(self, kind: str) -> bytes:
        self._open = kind
        index = self._index(kind)
        part: dict[str, Any]
        if kind == "reasoning":
            item, part = self._reasoning_item("in_progress", None), {"type": "reasoning_text", "text": ""}
            if self.meta.output.hidden:
                return self._event("response.output_item.added", output_index=index, item=item)
        else:
            item, part = (
                self._message_item("in_progress", None),
                {"type": "output_text", "annotations": [], "logprobs": [], "text": ""},
            )
        return self._event("response.output_item.added", output_index=index, item=item) + self._event(
            "response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part
        )

    def _close_item(self) -> bytes:
        kind, self._open = self._open, None
        if kind is None:
            return b""
        index = self._index(kind)
        out = self.meta.output
        part: dict[str, Any]
        if kind == "reasoning" and out.hidden:
            return self._event(
                "response.output_item.done", output_index=index, item=self._reasoning_item("completed", None)
            )
        if kind == "reasoning":
            text, item_id = out.reasoning_text, self._rs_id
            done = self._event(
                "response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0, text=text
            )
            part = {"type": "reasoning_text", "text": text}
            item = self._reasoning_item("completed", text)
        else:
            text, item_id = out.text, self._msg_id
            done = self._event(
                "response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            )
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
            item = self._message_item("completed", text)
        return (
            done
            + self._event("response.content_part.done", item_id=item_id, output_index=index, content_index=0, part=part)
            + self._event("response.output_item.done", output_index=index, item=item)
        )

    def start(self, usage: SimUsage) -> bytes:
        response = self._response("in_progress", [], None)
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def token(self, index: int) -> bytes:
        kind = "reasoning" if index < self._reasoning else "message"
        head = b""
        if self._open != kind:
            head = self._close_item() + self._open_item(kind)
        out = self.meta.output
        if kind == "reasoning" and out.hidden:
            return head  # the item's start at the first, then nothing: the reasoning is not shown
        if kind == "reasoning":
            return head + self._event(
                "response.reasoning_text.delta",
                item_id=self._rs_id,
                output_index=0,
                content_index=0,
                delta=out.reasoning[index],
            )
        return head + self._event(
            "response.output_text.delta",
            item_id=self._msg_id,
            output_index=self._index("message"),
            content_index=0,
            delta=out.answer[index - self._reasoning],
            logprobs=[],
        )

    def _status(self) -> str:
        return "incomplete" if self.meta.output.finish == "length" else "completed"

    def end(self, usage: SimUsage) -> bytes:
        status = self._status()
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return self._close_item() + self._event(kind, response=self._response(status, self._output(), usage))

    def interrupted(self) -> bytes:
        """Nothing more: the body just ends."""
        return b""

    def error(self, error: SimError) -> bytes:
        return self._event("error", code=error.code, message=error.message, param=None)

    def body(self, usage: SimUsage) -> dict[str, Any]:
        return self._response(self._status(), self._output(), usage)
