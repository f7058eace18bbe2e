"""Captured content in the shape the GenAI conventions give it, bounded: pure helpers the dialects share.

    gen_ai.input.messages       [{"role": "user", "parts": [{"type": "text", "content": "…"}]}, …]
    gen_ai.system_instructions  [{"type": "text", "content": "…"}]
    gen_ai.output.messages      [{"role": "assistant", "parts": […], "finish_reason": "stop"}]

Parts: `text`, `reasoning`, `tool_call` (`id`, `name`, `arguments`), `tool_call_response` (`id`,
`response`), `uri` (an image given by URL); other content is a part of its own `type` without
its data (no base64 images in spans). Each attribute is at most `CONTENT_LIMIT` characters of
JSON: longer strings are cut and end in `TRUNCATED`, and when that is not enough the oldest
messages give way to one that says so. The result is always valid JSON.

`Output` gathers a streamed answer's parts (only with capture on: the readers never call it
otherwise).

With `--capture-io-values`, two plain texts besides, for viewers that list traces by them
(OpenInference's `input.value` and `output.value`): `last_user_text` of the input messages and
`Output.answer`, each at most `CONTENT_LIMIT` characters (`bounded_text`).
"""

from __future__ import annotations

from typing import Any, TypeAlias

import orjson

__all__ = [
    "CONTENT_LIMIT",
    "TRUNCATED",
    "Message",
    "Output",
    "Part",
    "arguments",
    "bounded_json",
    "bounded_text",
    "finish_reason",
    "last_user_text",
    "no_messages",
    "text_part",
    "uri_part",
]

CONTENT_LIMIT = 64 * 1024  # characters of JSON per attribute
TRUNCATED = "…[truncated]"
Part: TypeAlias = dict[str, Any]
Message: TypeAlias = dict[str, Any]

# Provider stop reasons as the conventions name them; others are kept as the provider said.
_FINISH = {
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "completed": "stop",
    "length": "length",
    "max_tokens": "length",
    "max_output_tokens": "length",
    "tool_calls": "tool_call",
    "function_call": "tool_call",
    "tool_use": "tool_call",
    "content_filter": "content_filter",
    "refusal": "content_filter",
    "failed": "error",
}


def no_messages(obj: dict[str, Any]) -> tuple[list[Message], list[Part] | None]:
    """A dialect whose requests carry no messages (embeddings): nothing to capture."""
    return [], None


def finish_reason(reason: object) -> str:
    """The conventions' finish reason for a provider's (`stop` when it said nothing)."""
    if not isinstance(reason, str) or not reason:
        return "stop"
    return _FINISH.get(reason, reason)


def text_part(value: object, kind: str = "text") -> Part | None:
    """A `text` (or `reasoning`) part, or None when there is no text."""
    return {"type": kind, "content": value} if isinstance(value, str) and value else None


def uri_part(url: object, modality: str) -> Part | None:
    """An http(s) URL as a `uri` part, its query left out (signed URLs carry credentials there);
    None for anything else (a `data:` URL's bytes are never copied)."""
    if isinstance(url, str) and url.startswith(("http://", "https://")):
        return {"type": "uri", "modality": modality, "uri": url.split("?", 1)[0].split("#", 1)[0]}
    return None


def arguments(raw: object) -> object:
    """Tool-call arguments: the parsed JSON object when the string is one, else as given."""
    if isinstance(raw, str):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
        return value if isinstance(value, (dict, list)) else raw
    return raw if isinstance(raw, (dict, list)) else ""


def _cut(value: Any, limit: int) -> tuple[Any, bool]:
    """`value` with every string longer than `limit` cut (and marked); whether anything was."""
    if isinstance(value, str):
        return (value[:limit] + TRUNCATED, True) if len(value) > limit else (value, False)
    if isinstance(value, list):
        items = [_cut(v, limit) for v in value]
        return [v for v, _ in items], any(c for _, c in items)
    if isinstance(value, dict):
        pairs = {k: _cut(v, limit) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, any(c for _, c in pairs.values())
    return value, False


def bounded_json(value: list[Any], limit: int = CONTENT_LIMIT) -> str:
    """`value` as JSON of at most `limit` characters: long strings cut first, then, for a list of
    messages, the oldest dropped behind a note saying how many."""
    text = orjson.dumps(value).decode()
    if len(text) <= limit:
        return text
    cap = limit
    for _ in range(12):  # shrink the longest strings until the whole fits
        cap = max(16, int(cap * limit / len(text) * 0.9))
        cut, _changed = _cut(value, cap)
        text = orjson.dumps(cut).decode()
        if len(text) <= limit:
            return text
        if cap == 16:
            break
    # Too many messages even so: keep the latest that fit, behind a note saying how many went.
    items = cut if isinstance(cut, list) else []
    sizes = [len(orjson.dumps(item).decode()) + 1 for item in items]  # each with its comma
    room = limit - 100  # the note and the brackets
    start = len(items)
    while start > 0 and room - sizes[start - 1] >= 0:
        start -= 1
        room -= sizes[start]
    note: dict[str, Any] = {"type": "text", "content": f"{start} earlier {TRUNCATED}"}
    if items and isinstance(items[0], dict) and "role" in items[0]:
        note = {"role": "user", "parts": [note]}
    return orjson.dumps([note, *items[start:]]).decode()


def bounded_text(value: str, limit: int = CONTENT_LIMIT) -> str:
    """`value` in at most `limit` characters: cut, and ending in `TRUNCATED`, when longer."""
    return value if len(value) <= limit else value[: max(0, limit - len(TRUNCATED))] + TRUNCATED


def _texts(parts: list[Part]) -> str:
    """The content of the text parts, one part a line."""
    texts = []
    for p in parts:
        content = p.get("content") if p.get("type") == "text" else None
        if isinstance(content, str) and content:
            texts.append(content)
    return "\n".join(texts)


def last_user_text(messages: list[Message]) -> str | None:
    """`input.value`: the text of the last user message that has any (a turn that only returns
    tool results keeps the question that started it), bounded; None without one."""
    for m in reversed(messages):
        if m.get("role") == "user":
            text = _texts(m.get("parts") or [])
            if text:
                return bounded_text(text)
    return None


class _Choice:
    """One answer's parts, in the order they began."""

    __slots__ = ("parts", "texts", "calls", "reason")

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self.texts: dict[int, list[str]] = {}  # id(part) -> its text pieces, joined at the end
        self.calls: dict[object, Part] = {}  # a tool call's key (its index or id) -> its part
        self.reason: str | None = None


class Output:
    """The parts of a streamed answer as they arrive, per choice; `messages()` shapes them.

    Keeps at most `limit` characters of text and arguments; beyond, the answer is marked cut."""

    __slots__ = ("choices", "kept", "limit", "cut")

    def __init__(self, limit: int = CONTENT_LIMIT) -> None:
        self.choices: dict[int, _Choice] = {}
        self.kept = 0
        self.limit = limit
        self.cut = False

    def _room(self, value: str) -> bool:
        if self.kept >= self.limit:
            self.cut = True
            return False
        self.kept += len(value)
        return True

    def _choice(self, index: object) -> _Choice:
        key = index if isinstance(index, int) else 0
        choice = self.choices.get(key)
        if choice is None:
            choice = self.choices[key] = _Choice()
        return choice

    def text(self, value: object, index: object = 0, kind: str = "text") -> None:
        """Text (or reasoning) that continues the answer's last part of that kind, or starts one."""
        if not isinstance(value, str) or not value or not self._room(value):
            return
        choice = self._choice(index)
        last = choice.parts[-1] if choice.parts else None
        if last is None or last["type"] != kind:
            last = {"type": kind, "content": ""}
            choice.parts.append(last)
            choice.texts[id(last)] = []
        choice.texts[id(last)].append(value)

    def tool_call(self, key: object, call_id: object, name: object, args: object, index: object = 0) -> None:
        """A tool call begins (`call_id`, `name`) or continues (`args`, a piece of its JSON)."""
        choice = self._choice(index)
        part = choice.calls.get(key)
        if part is None:
            part = {"type": "tool_call", "id": None, "name": "", "arguments": ""}
            choice.calls[key] = part
            choice.parts.append(part)
            choice.texts[id(part)] = []
        if isinstance(call_id, str) and call_id:
            part["id"] = call_id
        if isinstance(name, str) and name:
            part["name"] = name
        if isinstance(args, str) and args and self._room(args):
            choice.texts[id(part)].append(args)

    def finish(self, reason: object, index: object = 0) -> None:
        if isinstance(reason, str) and reason:
            self._choice(index).reason = reason

    def answer(self) -> str | None:
        """`output.value`: the first choice's text (its reasoning when it has no text), marked
        when the answer was cut, bounded; None when it has neither (only tool calls)."""
        if not self.choices:
            return None
        choice = self.choices[min(self.choices)]
        for kind in ("text", "reasoning"):
            pieces = ["".join(choice.texts.get(id(part), ())) for part in choice.parts if part["type"] == kind]
            text = "\n".join(piece for piece in pieces if piece)
            if text:
                if self.cut and choice.parts[-1]["type"] == kind:  # marked where `messages` marks it
                    text += TRUNCATED
                return bounded_text(text)
        return None

    def messages(self, default_reason: object = None) -> list[Message]:
        """`gen_ai.output.messages`: one assistant message per choice, in choice order."""
        out = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            parts = []
            for part in choice.parts:
                joined = "".join(choice.texts.get(id(part), ()))
                if part["type"] == "tool_call":
                    parts.append({**part, "arguments": arguments(joined) if joined else part["arguments"]})
                else:
                    parts.append({"type": part["type"], "content": joined})
            if self.cut and parts:
                last = parts[-1]
                if last["type"] != "tool_call":
                    last["content"] += TRUNCATED
            reason = choice.reason or default_reason
            out.append({"role": "assistant", "parts": parts, "finish_reason": finish_reason(reason)})
        return out
