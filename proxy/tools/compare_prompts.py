"""The prompts `taotrace compare` sends: the built-in set, a JSONL file, or captured requests. Pure.

One JSON object per line (blank lines are skipped), in any of the shapes a request body has:

    {"prompt": "Explain TCP slow start."}
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    {"system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}      (Anthropic style)
    {"input": "Hi"}  or  {"input": [{"role": "user", "content": "Hi"}]}             (Responses style)

with optional `"name"` (the prompt's label in the table) and `"max_tokens"` (its output cap).
The live view's captured input (`serve --capture-content`) is one of these shapes, so requests
taken from a running proxy are read by the same rules. A system text is kept apart and sent the
way each dialect wants it (a system turn, Anthropic's `system`, Responses' `instructions`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.dialects import API_CHAT, API_COMPLETIONS, API_MESSAGES, API_RESPONSES
from proxy.tools.client import Call

__all__ = ["BUILTIN_PROMPTS", "Prompt", "PromptError", "call_for", "parse_jsonl", "prompt_from"]

_KEYS = ("name", "prompt", "messages", "system", "input", "max_tokens")
_SYSTEM_ROLES = ("system", "developer")


class PromptError(ValueError):
    """A prompt that cannot be used; the message names the line and what is wrong."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt to compare on: its label, the conversation, a system text and an output cap."""

    name: str
    turns: tuple[Mapping[str, Any], ...]  # role/content turns, system turns taken out
    system: str | None = None
    max_tokens: int | None = None


def _text(content: object) -> str | None:
    """A content value as plain text: a string, or the `text` of its parts; None if neither."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, Mapping)]
        if texts and all(isinstance(t, str) for t in texts):
            return "\n".join(str(t) for t in texts)
    return None


def _turns(items: object, key: str) -> tuple[list[Mapping[str, Any]], list[str]]:
    """Turns and system texts from a `messages` or `input` list; raises PromptError."""
    if not isinstance(items, list) or not items:
        raise PromptError(f"{key!r} must be a non-empty list of turns")
    turns: list[Mapping[str, Any]] = []
    systems: list[str] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping) or not isinstance(item.get("role"), str) or "content" not in item:
            raise PromptError(f"{key}[{i}] must be an object with 'role' and 'content'")
        if item["role"] in _SYSTEM_ROLES:
            text = _text(item["content"])
            if text is None:
                raise PromptError(f"{key}[{i}]: a system turn's content must be text")
            systems.append(text)
        else:
            turns.append({"role": item["role"], "content": item["content"]})
    if not turns:
        raise PromptError(f"{key!r} has no turn besides the system text")
    return turns, systems


def prompt_from(obj: object, name: str) -> Prompt:
    """One prompt from a decoded JSON object; `name` unless it names itself. Raises PromptError."""
    if not isinstance(obj, Mapping):
        raise PromptError('expected a JSON object, e.g. {"prompt": "..."}')
    unknown = sorted(set(obj) - set(_KEYS))
    if unknown:
        raise PromptError(f"unknown key {unknown[0]!r} (allowed: {', '.join(_KEYS)})")
    given = [k for k in ("prompt", "messages", "input") if k in obj]
    if len(given) != 1:
        raise PromptError("needs exactly one of 'prompt', 'messages' or 'input'")
    systems: list[str] = []
    if "system" in obj:
        text = _text(obj["system"])
        if text is None:
            raise PromptError("'system' must be text (or a list of text blocks)")
        systems.append(text)
    source = obj[given[0]]
    if isinstance(source, str) and given[0] in ("prompt", "input"):
        if not source.strip():
            raise PromptError(f"{given[0]!r} is empty")
        turns: list[Mapping[str, Any]] = [{"role": "user", "content": source}]
    elif given[0] == "prompt":
        raise PromptError("'prompt' must be a string")
    else:
        turns, more = _turns(source, given[0])
        systems.extend(more)
    label = obj.get("name", name)
    if not isinstance(label, str) or not label.strip():
        raise PromptError("'name' must be a non-empty string")
    cap = obj.get("max_tokens")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise PromptError("'max_tokens' must be a positive integer")
    return Prompt(label.strip(), tuple(turns), "\n\n".join(systems) if systems else None, cap)


def parse_jsonl(text: str, source: str) -> list[Prompt]:
    """Every prompt of a JSONL text; `source` names it in errors ("prompts.jsonl line 3: ...")."""
    prompts: list[Prompt] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptError(f"{source} line {number}: not JSON ({exc.msg} at column {exc.colno})") from None
        try:
            prompts.append(prompt_from(obj, f"line-{number}"))
        except PromptError as exc:
            raise PromptError(f"{source} line {number}: {exc}") from None
    if not prompts:
        raise PromptError(f'{source}: no prompts (one JSON object per line, e.g. {{"prompt": "..."}})')
    return prompts


def _flat(prompt: Prompt) -> str:
    """The whole prompt as one text, for the legacy completions dialect."""
    parts = [prompt.system] if prompt.system else []
    parts += [_text(t["content"]) or json.dumps(t["content"]) for t in prompt.turns]
    return "\n\n".join(parts)


def call_for(prompt: Prompt, api: str, model: str, max_tokens: int, params: Mapping[str, Any]) -> Call:
    """The streaming call that sends `prompt` in dialect `api` (its own cap wins over `max_tokens`)."""
    extra = dict(params)
    cap = prompt.max_tokens or max_tokens
    turns: Sequence[Mapping[str, Any]] = prompt.turns
    if api == API_COMPLETIONS:
        return Call(api, model, _flat(prompt), cap, extra)
    if prompt.system is not None:
        if api == API_CHAT:
            turns = [{"role": "system", "content": prompt.system}, *turns]
        elif api == API_MESSAGES:
            extra["system"] = prompt.system
        elif api == API_RESPONSES:
            extra["instructions"] = prompt.system
    return Call(api, model, _text(turns[-1]["content"]) or "", cap, extra, messages=tuple(turns))


_PASSAGE = (
    "A request to a language model spends its time in three places. The network carries the "
    "request to the provider and the answer back; the server queues the request, then reads the "
    "whole prompt in one pass (prefill), which grows with the prompt's length; then it writes the "
    "answer one token at a time (decode), at a pace set by the model's size and the batch it "
    "shares the accelerator with. "
)

BUILTIN_PROMPTS: tuple[Prompt, ...] = (
    Prompt("short-fact", ({"role": "user", "content": "What is the capital of Australia? One sentence."},)),
    Prompt("short-code", ({"role": "user", "content": "Write a Python function that reverses a string."},)),
    Prompt(
        "short-chat",
        ({"role": "user", "content": "Suggest a name for a cat who likes boxes."},),
        system="You are a helpful assistant. Answer briefly.",
    ),
    Prompt(
        "long-summary", ({"role": "user", "content": _PASSAGE * 12 + "\n\nSummarise the text above in two sentences."},)
    ),
    Prompt(
        "long-question",
        ({"role": "user", "content": _PASSAGE * 30 + "\n\nWhich of the three places grows with the prompt's length?"},),
    ),
)
