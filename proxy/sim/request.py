"""Read a request body of any dialect into one `SimRequest`: model, prompt text, limits, stream.

The prompt is rendered in a ChatML-like template (`<|im_start|>role\\n...<|im_end|>`) so that
equal conversations give equal tokens, which is what the prefix cache keys on.
A failure trigger is read from the `x-sim-fail` header or a `[sim:CASE]` marker in the prompt.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.sim.errors import bad_request

__all__ = ["FAILURES", "SimRequest", "parse_request"]

FAILURES = frozenset({"429", "500", "503", "midstream", "cut", "stall", "unfinished", "empty"})
_MARKER = re.compile(r"\[sim:([a-z0-9_-]+)\]")
_EFFORT = frozenset({"minimal", "low", "medium", "high"})
LEGACY_COMPLETIONS_DEFAULT_MAX = 16  # what /completions generates when max_tokens is absent


@dataclass(frozen=True, slots=True)
class SimRequest:
    """What the simulator needs from a request, whatever its dialect."""

    api: str
    model: str
    prompt: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    reasoning_effort: str | None
    failure: str | None


def _text(content: object) -> str:
    """Text of a message content: a string, or parts with `text` / nested `content`."""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        for key in ("text", "content", "input", "output", "arguments", "thinking"):
            if key in content:
                return _text(content[key])
        return ""
    if isinstance(content, list):
        return "".join(_text(part) for part in content)
    return ""


def _turn(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def _messages(messages: object, field: str) -> str:
    if not isinstance(messages, list) or not messages:
        raise bad_request(f"'{field}' must be a non-empty array")
    out = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise bad_request(f"each item of '{field}' must be an object")
        role = str(message.get("role") or message.get("type") or "user")
        out.append(_turn(role, _text(message.get("content", message))))
    return "".join(out)


def _positive(body: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise bad_request(f"'{name}' must be a positive integer", "invalid_value")
        return value
    return None


def _prompt(api: str, body: Mapping[str, Any]) -> str:
    tools = body.get("tools")
    prefix = _turn("tools", str(tools)) if tools else ""
    if api == "chat_completions":
        return prefix + _messages(body.get("messages"), "messages") + "<|im_start|>assistant\n"
    if api == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = "".join(p for p in prompt if isinstance(p, str))
        if not isinstance(prompt, str):
            raise bad_request("'prompt' must be a string")
        return prompt
    if api == "responses":
        instructions = body.get("instructions")
        head = _turn("system", instructions) if isinstance(instructions, str) else ""
        source = body.get("input")
        turns = _turn("user", source) if isinstance(source, str) else _messages(source, "input")
        return prefix + head + turns + "<|im_start|>assistant\n"
    # messages
    system = body.get("system")
    head = _turn("system", _text(system)) if system else ""
    return prefix + head + _messages(body.get("messages"), "messages") + "<|im_start|>assistant\n"


def _effort(api: str, body: Mapping[str, Any]) -> str | None:
    effort: object = body.get("reasoning_effort")
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping):
        effort = reasoning.get("effort", effort)
    thinking = body.get("thinking")
    if api == "messages" and isinstance(thinking, Mapping) and thinking.get("type") == "disabled":
        effort = "minimal"
    return effort if isinstance(effort, str) and effort in _EFFORT else None


def parse_request(api: str, body: object, headers: Mapping[str, str]) -> SimRequest:
    """Validate a JSON body as the provider would (400 on what it would reject)."""
    if not isinstance(body, Mapping):
        raise bad_request("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("you must provide a model parameter")
    prompt = _prompt(api, body)
    if api == "chat_completions":
        max_tokens = _positive(body, "max_completion_tokens", "max_tokens")
    elif api == "completions":
        max_tokens = _positive(body, "max_tokens") or LEGACY_COMPLETIONS_DEFAULT_MAX
    elif api == "responses":
        max_tokens = _positive(body, "max_output_tokens")
    else:
        max_tokens = _positive(body, "max_tokens")
        if max_tokens is None:
            raise bad_request("max_tokens: Field required")
    options = body.get("stream_options")
    include_usage = isinstance(options, Mapping) and options.get("include_usage") is True
    failure = headers.get("x-sim-fail") or next(iter(_MARKER.findall(prompt)), None)
    if failure is not None and failure not in FAILURES:
        raise bad_request(f"unknown failure trigger '{failure}' (known: {', '.join(sorted(FAILURES))})")
    return SimRequest(
        api=api,
        model=model,
        prompt=prompt,
        stream=body.get("stream") is True,
        include_usage=include_usage,
        max_tokens=max_tokens,
        reasoning_effort=_effort(api, body),
        failure=failure,
    )
