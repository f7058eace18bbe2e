"""OpenAI legacy completions: the chat framing (`data: {...}` … `data: [DONE]`), with the text
in `choices[].text`."""

from __future__ import annotations

from typing import Any

from proxy.dialects.chat import ChatReader
from proxy.dialects.dialect import COMMON_PARAMS, Dialect
from proxy.dialects.reader import nonempty

__all__ = ["API_COMPLETIONS", "DIALECT", "CompletionsReader"]

API_COMPLETIONS = "completions"


class CompletionsReader(ChatReader):
    """Legacy `/completions`: `choices[].text`."""

    __slots__ = ()

    def _choice_has_token(self, choice: dict[str, Any]) -> bool:
        text = choice.get("text")
        self._keep(text)
        return nonempty(text)


DIALECT = Dialect(
    api=API_COMPLETIONS,
    path_suffix="/completions",
    operation="text_completion",
    provider="openai",
    reader=CompletionsReader,
    params=(
        *COMMON_PARAMS,
        ("max_tokens", "gen_ai.request.max_tokens", int),
        ("stop", "gen_ai.request.stop_sequences", list),
        ("n", "gen_ai.request.choice.count", int),
    ),
)
