"""OpenAI chat completions: `data: {chat.completion.chunk}` … `data: [DONE]`; with
`stream_options.include_usage`, one usage-only chunk (`choices: []`) before `[DONE]`."""

from __future__ import annotations

from typing import Any

from proxy.dialects.content import Message, Output, Part, arguments, text_part, uri_part
from proxy.dialects.dialect import COMMON_PARAMS, Dialect
from proxy.dialects.reader import (
    ANSWER,
    NOT_TOKEN,
    REASONING,
    StreamReader,
    items,
    loads,
    nonempty,
    openai_output_type,
    openai_usage,
)
from proxy.dialects.sse import SSEEvent

__all__ = ["API_CHAT", "DIALECT", "ChatReader", "input_messages"]

API_CHAT = "chat_completions"


class ChatReader(StreamReader):
    """`data: {chat.completion.chunk}` … `data: [DONE]`; legacy completions share the framing."""

    __slots__ = ()

    def feed(self, event: SSEEvent) -> int:
        data = event.data
        if data == b"[DONE]":  # the comparison the base class made anyway: the terminal check is free
            self.done = True
            return NOT_TOKEN
        obj = loads(data)
        if not isinstance(obj, dict):
            return NOT_TOKEN
        return self._read(event.event, obj)

    @property
    def complete(self) -> bool:
        """A choice ended with a `finish_reason`. `data: [DONE]` alone is not an end (an engine
        interrupting a generation sends it without one); nor is it required: some
        OpenAI-compatible servers never send it."""
        return bool(self.finish_reasons)

    def _read(self, kind: str, obj: dict[str, Any]) -> int:
        if "error" in obj and obj["error"]:
            self.error_type = "stream_error"
            return NOT_TOKEN
        # This runs once per chunk: the calls below are skipped when they could change nothing.
        if self.response_id is None or self.response_model is None:
            self._meta(obj)
        usage = obj.get("usage")
        if usage:
            self.usage = openai_usage(usage) or self.usage
        token = NOT_TOKEN
        for choice in items(obj.get("choices")):
            if not isinstance(choice, dict):
                continue
            reason = choice.get("finish_reason")
            if reason:
                self._finish(reason)
                if self.out is not None:
                    self.out.finish(reason, choice.get("index"))
            found = self._choice_token(choice)
            if found and token != ANSWER:  # n > 1: one choice's answer outweighs another's reasoning
                token = found
        return token

    def _choice_token(self, choice: dict[str, Any]) -> int:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return NOT_TOKEN
        content = delta.get("content")
        out = self.out  # None unless capture is on: then nothing below is kept
        if isinstance(content, str) and content:
            if out is not None:
                out.text(content, choice.get("index"))
            return ANSWER  # the common chunk: the other fields cannot change the answer or the capture
        found = NOT_TOKEN
        # DeepSeek's `reasoning_content`, vLLM's and OpenRouter's `reasoning` (beside an empty
        # `content`): reasoning; a refusal or a tool call's arguments: the answer.
        for key in ("reasoning_content", "reasoning", "refusal"):
            value = delta.get(key)
            if nonempty(value):
                if key == "refusal":
                    found = ANSWER
                elif not found:
                    found = REASONING
                if out is not None:
                    out.text(value, choice.get("index"), "text" if key == "refusal" else "reasoning")
        for call in items(delta.get("tool_calls")):
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                if nonempty(fn.get("arguments")):
                    found = ANSWER
                if out is not None:
                    out.tool_call(
                        call.get("index"), call.get("id"), fn.get("name"), fn.get("arguments"), choice.get("index")
                    )
        return found

    def _read_whole(self, obj: dict[str, Any]) -> None:
        self._meta(obj)
        self.usage = openai_usage(obj.get("usage"))
        out = self.out
        for choice in items(obj.get("choices")):
            if isinstance(choice, dict):
                self._finish(choice.get("finish_reason"))
                if out is not None:
                    _whole_choice(out, choice)


def _whole_choice(out: Output, choice: dict[str, Any]) -> None:
    """One choice of a whole answer (`message`, or legacy `text`), kept as output parts."""
    index = choice.get("index")
    out.finish(choice.get("finish_reason"), index)
    message = choice.get("message")
    if not isinstance(message, dict):
        out.text(choice.get("text"), index)
        return
    out.text(message.get("reasoning_content") or message.get("reasoning"), index, "reasoning")
    out.text(message.get("content"), index)
    out.text(message.get("refusal"), index)
    for i, call in enumerate(items(message.get("tool_calls"))):
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            out.tool_call(i, call.get("id"), fn.get("name"), fn.get("arguments"), index)


def _content_parts(content: object) -> list[Part]:
    """A chat message's `content`: a string, or an array of text and image parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    parts: list[Part] = []
    for item in items(content):
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "text":
            part = text_part(item.get("text"))
            if part is not None:
                parts.append(part)
        elif kind == "image_url":
            image = item.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            parts.append(uri_part(url, "image") or {"type": "image_url"})
        elif isinstance(kind, str):
            parts.append({"type": kind})  # audio, files: named, their data left out
    return parts


def input_messages(obj: dict[str, Any]) -> tuple[list[Message], list[Part] | None]:
    """`messages` as the conventions' input messages; system messages stay among them (they are
    part of the chat history here)."""
    messages: list[Message] = []
    for m in items(obj.get("messages")):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            continue
        role = m["role"]
        if role == "tool":
            parts: list[Part] = [
                {"type": "tool_call_response", "id": m.get("tool_call_id"), "response": m.get("content")}
            ]
        else:
            parts = _content_parts(m.get("content"))
            for call in items(m.get("tool_calls")):
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    parts.append(
                        {
                            "type": "tool_call",
                            "id": call.get("id"),
                            "name": fn.get("name"),
                            "arguments": arguments(fn.get("arguments")),
                        }
                    )
        messages.append({"role": role, "parts": parts})
    return messages, None


def _output_type(obj: dict[str, Any]) -> str | None:
    """`gen_ai.output.type` from `response_format`: `json` or `text`."""
    return openai_output_type(obj.get("response_format"))


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
    input_messages=input_messages,
)
