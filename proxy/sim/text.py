"""What the simulated models say: deterministic text, cut into one-token pieces.

The answer and the reasoning are drawn from two fixed paragraphs (about the life of a request),
starting at a sentence chosen by a seed, so equal requests get equal answers. Each piece (a word
with its leading space, or a punctuation mark) is one output token; the counts the simulator
reports are exactly the pieces it streamed.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from proxy.sim.catalogue import ModelSpec

__all__ = ["Output", "plan_output"]

_ANSWER = (
    "A request first waits in the server's queue. Then the prompt is tokenized and the model "
    "reads all of it at once: that is the prefill, and its cost grows with the length of the "
    "input. The first token appears when the prefill ends, which is why the time to first token "
    "rises with long prompts. After that the model writes one token per step: that is the decode, "
    "and its pace depends on the size of the model, not on the prompt. Many requests share each "
    "decode step, so a busy server is a little slower per token. The keys and values of every "
    "token stay in the KV cache while the request runs; a repeated prefix can reuse them and skip "
    "most of its prefill. When the last token is written the blocks are released. "
)
_REASONING = (
    "Okay, the user wants to know where the time of a request goes. Let me think about the phases. "
    "There is the network, then the queue, then the prefill over the prompt, then the decode. "
    "The prefill depends on the input length; the decode depends on the model size. I should "
    "mention the prefix cache, and the memory each token holds. Let me check the numbers again "
    "before answering. "
)
_EFFORT = {"minimal": 0.0, "low": 0.5, "medium": 1.0, "high": 2.0}


def _pieces(paragraph: str) -> tuple[str, ...]:
    return tuple(re.findall(r" ?\w+| ?[^\w\s]+", paragraph))


_ANSWER_PIECES = _pieces(_ANSWER)
_REASONING_PIECES = _pieces(_REASONING)
_SENTENCE_STARTS = tuple(i + 1 for i, p in enumerate(_ANSWER_PIECES[:-1]) if p == ".") or (0,)


@dataclass(frozen=True, slots=True)
class Output:
    """A planned completion: reasoning pieces, answer pieces, and why it stops."""

    reasoning: tuple[str, ...]
    answer: tuple[str, ...]
    finish: str  # stop | length
    hidden: bool = False  # the reasoning is counted and billed, never streamed (nor in a whole body)

    @property
    def total(self) -> int:
        return len(self.reasoning) + len(self.answer)

    @property
    def text(self) -> str:
        return "".join(self.answer)

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)


def _take(pieces: tuple[str, ...], start: int, count: int) -> tuple[str, ...]:
    n = len(pieces)
    # Past the paragraph's end it starts again: its first word then needs the space it lacks.
    out = [pieces[j % n] if j % n or j < n else " " + pieces[0] for j in range(start, start + count)]
    if out:
        out[0] = out[0].lstrip(" ") or out[0]
    return tuple(out)


def plan_output(spec: ModelSpec, *, max_tokens: int | None, effort: str | None, seed: str) -> Output:
    """How many tokens of each kind this request produces, and their text.

    No limit in the request: the model's reasoning (by effort) and then its natural answer
    length (`natural_output_tokens`), finish `stop`. A limit (`max_tokens`,
    `max_completion_tokens`, `max_output_tokens`): exactly that many tokens, reasoning first,
    finish `length`, as a real model cut by its limit; a limit above the model's
    `max_output_tokens` gets that many and finish `stop` (the model ended on its own first).
    """
    wanted_reasoning = round(spec.reasoning_tokens * _EFFORT.get(effort or "medium", 1.0)) if spec.reasoning else 0
    if max_tokens is None:
        total, finish = min(wanted_reasoning + spec.natural_output_tokens, spec.max_output_tokens), "stop"
    elif max_tokens > spec.max_output_tokens:
        total, finish = spec.max_output_tokens, "stop"
    else:
        total, finish = max_tokens, "length"
    reasoning = min(wanted_reasoning, max(0, total - 1))  # at least one answer token
    start = _SENTENCE_STARTS[zlib.crc32(seed.encode("utf-8")) % len(_SENTENCE_STARTS)]
    return Output(
        reasoning=_take(_REASONING_PIECES, 0, reasoning),
        answer=_take(_ANSWER_PIECES, start, total - reasoning),
        finish=finish,
        hidden=spec.reasoning_hidden,
    )
