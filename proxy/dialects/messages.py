"""Anthropic Messages: `message_start` (usage: input, cache reads and writes),
`content_block_delta` (the tokens), `message_delta` (cumulative output usage, stop reason),
`message_stop`; `ping` anywhere; `event: error`."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.content import Message, Output, Part, text_part, uri_part
from proxy.dialects.dialect import Dialect
from proxy.dialects.reader import ANSWER, NOT_TOKEN, REASONING, StreamReader, Usage, items, loads, nonempty, nonneg_int
from proxy.dialects.sse import SSEEvent

__all__ = ["API_MESSAGES", "DIALECT", "MessagesReader", "input_messages"]

API_MESSAGES = "messages"


def _usage(u: object, previous: Usage | None, with_output: bool = True) -> Usage | None:
    """Anthropic counts cache reads and writes apart from `input_tokens`; GenAI input includes them.
    `with_output` False: leave out `output_tokens` (`message_start`'s is a placeholder, 1 or so)."""
    if not isinstance(u, dict):
        return previous
    prev = previous or Usage()
    base = nonneg_int(u.get("input_tokens"))
    read = nonneg_int(u.get("cache_read_input_tokens"))
    write = nonneg_int(u.get("cache_creation_input_tokens"))
    total = None if base is None and read is None and write is None else (base or 0) + (read or 0) + (write or 0)
    output = nonneg_int(u.get("output_tokens")) if with_output else None
    return Usage(
        input_tokens=total if total is not None else prev.input_tokens,
        output_tokens=output if output is not None else prev.output_tokens,
        cached_input_tokens=read if read is not None else prev.cached_input_tokens,
        reasoning_tokens=prev.reasoning_tokens,
        cache_creation_input_tokens=write if write is not None else prev.cache_creation_input_tokens,
    )


class MessagesReader(StreamReader):
    """Anthropic Messages: usage in `message_start` and (cumulative) `message_delta`."""

    __slots__ = ()
    SKIP = frozenset({"ping", "content_block_start", "content_block_stop", "message_stop"})

    def feed(self, event: SSEEvent) -> int:
        kind = event.event
        if kind in self.SKIP:
            if kind == "message_stop":  # checked only among the skipped events: free for the deltas
                self.done = True
            elif kind == "content_block_start" and self.out is not None:  # a tool call's id and name
                obj = loads(event.data)
                if isinstance(obj, dict):
                    _block_start(self.out, obj)
            return NOT_TOKEN
        obj = loads(event.data)
        if not isinstance(obj, dict):
            return NOT_TOKEN
        return self._read(kind, obj)

    @property
    def complete(self) -> bool:
        """`message_delta` gave the `stop_reason`. `message_stop` is not required: some
        Anthropic-compatible gateways close the stream right after `message_delta`."""
        return bool(self.finish_reasons)

    def _read(self, kind: str, obj: dict[str, Any]) -> int:
        typ = obj.get("type")
        if isinstance(typ, str):
            kind = typ
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                return NOT_TOKEN
            # `thinking_delta` is reasoning; its block's closing `signature_delta` is no token, and a
            # `redacted_thinking` block streams none (its data comes whole in the block's start).
            for key in ("text", "thinking", "partial_json"):
                value = delta.get(key)
                if nonempty(value):
                    out = self.out  # None unless capture is on
                    if out is not None:
                        if key == "partial_json":
                            out.tool_call(obj.get("index"), None, None, value)
                        else:
                            out.text(value, 0, "text" if key == "text" else "reasoning")
                    return REASONING if key == "thinking" else ANSWER
            return NOT_TOKEN
        if kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict):
                self._meta(message)
                # Its output count is a placeholder: a stream cut before `message_delta` has its
                # output counted from the token events instead (record.usage_of).
                self.usage = _usage(message.get("usage"), self.usage, with_output=False)
        elif kind == "message_delta":
            self.usage = _usage(obj.get("usage"), self.usage)
            delta = obj.get("delta")
            if isinstance(delta, dict):
                self._finish(delta.get("stop_reason"))
                if self.out is not None:
                    self.out.finish(delta.get("stop_reason"))
        elif kind == "message_stop":  # a stream without `event:` lines names it only in the data
            self.done = True
        elif kind == "error":
            self.error_type = "stream_error"
        return NOT_TOKEN

    def _read_whole(self, obj: dict[str, Any]) -> None:
        self._meta(obj)
        self.usage = _usage(obj.get("usage"), None)
        self._finish(obj.get("stop_reason"))
        out = self.out
        if out is None:
            return
        out.finish(obj.get("stop_reason"))
        for i, block in enumerate(items(obj.get("content"))):
            if isinstance(block, dict):
                _block_start(out, {"index": i, "content_block": block})
                out.text(block.get("text"))
                out.text(block.get("thinking"), 0, "reasoning")


def _block_start(out: Output, obj: dict[str, Any]) -> None:
    """`content_block_start` (or a whole answer's block): a tool call's id, name and any input."""
    block = obj.get("content_block")
    if isinstance(block, dict) and block.get("type") in ("tool_use", "server_tool_use"):
        given = block.get("input")
        args = orjson.dumps(given).decode() if isinstance(given, dict) and given else None
        out.tool_call(obj.get("index"), block.get("id"), block.get("name"), args)


def _blocks(content: object) -> list[Part]:
    """A message's `content` (a string or blocks) as parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    parts: list[Part] = []
    for block in items(content):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            part = text_part(block.get("text"))
        elif kind == "thinking":
            part = text_part(block.get("thinking"), "reasoning")
        elif kind == "tool_use":
            part = {
                "type": "tool_call",
                "id": block.get("id"),
                "name": block.get("name"),
                "arguments": block.get("input"),
            }
        elif kind == "tool_result":
            result = block.get("content")
            if not isinstance(result, str):  # blocks: their text
                result = "".join(p["content"] for p in _blocks(result) if p["type"] == "text")
            part = {"type": "tool_call_response", "id": block.get("tool_use_id"), "response": result}
        elif kind == "image":
            source = block.get("source")
            part = uri_part(source.get("url") if isinstance(source, dict) else None, "image") or {"type": "image"}
        else:
            part = {"type": kind} if isinstance(kind, str) else None  # documents and others: named, not copied
        if part is not None:
            parts.append(part)
    return parts


def input_messages(obj: dict[str, Any]) -> tuple[list[Message], list[Part] | None]:
    """`messages` as input messages; `system` (given apart) as the system instructions."""
    system = obj.get("system")
    instructions = _blocks(system) if system else None
    messages = [
        {"role": m["role"], "parts": _blocks(m.get("content"))}
        for m in items(obj.get("messages"))
        if isinstance(m, dict) and isinstance(m.get("role"), str)
    ]
    return messages, instructions or None


def _end_user(obj: dict[str, Any]) -> str | None:
    """The caller's own user id: `metadata.user_id`."""
    metadata = obj.get("metadata")
    value = metadata.get("user_id") if isinstance(metadata, dict) else None
    return value if isinstance(value, str) and value else None


DIALECT = Dialect(
    api=API_MESSAGES,
    path_suffix="/messages",
    operation="chat",
    provider="anthropic",
    reader=MessagesReader,
    params=(
        ("temperature", "gen_ai.request.temperature", float),
        ("top_p", "gen_ai.request.top_p", float),
        ("top_k", "gen_ai.request.top_k", int),
        ("max_tokens", "gen_ai.request.max_tokens", int),
        ("stop_sequences", "gen_ai.request.stop_sequences", list),
    ),
    end_user=_end_user,
    input_messages=input_messages,
)
