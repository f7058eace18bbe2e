"""OpenAI legacy completions: the chat framing (`data: {...}` … `data: [DONE]`), with the text
in `choices[].text`."""

from __future__ import annotations

from typing import Any

from proxy.dialects.chat import ChatReader
from proxy.dialects.content import Message, Part
from proxy.dialects.dialect import COMMON_PARAMS, Dialect
from proxy.dialects.reader import ANSWER, NOT_TOKEN, items, nonempty

__all__ = ["API_COMPLETIONS", "DIALECT", "CompletionsReader"]

API_COMPLETIONS = "completions"


class CompletionsReader(ChatReader):
    """Legacy `/completions`: `choices[].text`."""

    __slots__ = ()

    def _choice_token(self, choice: dict[str, Any]) -> int:
        text = choice.get("text")
        self._keep(text, choice.get("index"))
        return ANSWER if nonempty(text) else NOT_TOKEN


def input_messages(obj: dict[str, Any]) -> tuple[list[Message], list[Part] | None]:
    """`prompt` (a string or a list of them) as user messages."""
    prompt = obj.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else [p for p in items(prompt) if isinstance(p, str)]
    return [{"role": "user", "parts": [{"type": "text", "content": p}]} for p in prompts], None


DIALECT = Dialect(
    api=API_COMPLETIONS,
    path_suffix="/completions",
    operation="text_completion",
    provider="openai",
    reader=CompletionsReader,
    input_messages=input_messages,
    params=(
        *COMMON_PARAMS,
        ("max_tokens", "gen_ai.request.max_tokens", int),
        ("stop", "gen_ai.request.stop_sequences", list),
        ("n", "gen_ai.request.choice.count", int),
    ),
)
