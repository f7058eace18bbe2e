"""What `taotrace compare` sends in which order, and what it keeps of each answer. Pure.

Every round sends each prompt to both targets, one right after the other; which goes first
alternates (A B, B A, A B, ...: the ABBA pattern, so a slow drift favours neither) or is drawn at
random per pair with a seeded RNG.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from proxy.tools.client import Measurement

__all__ = ["LABELS", "METRICS", "REASONING_KEYS", "Metric", "Sample", "Step", "pairs_of", "schedule", "values_of"]

LABELS = ("A", "B")
Order = Literal["alternate", "random"]


@dataclass(frozen=True, slots=True)
class Step:
    """One request to make: the round, the prompt's index and the target's (0 = A, 1 = B)."""

    round: int
    prompt: int
    target: int


@dataclass(frozen=True, slots=True)
class Sample:
    """One request made: its step and what the client measured."""

    step: Step
    measurement: Measurement


def schedule(prompts: int, rounds: int, order: Order, rng: random.Random) -> list[Step]:
    """Every (round, prompt) pair sent to both targets, back to back, first target per `order`."""
    steps: list[Step] = []
    for r in range(rounds):
        for p in range(prompts):
            if order == "random":
                first = rng.randrange(2)
            else:
                first = len(steps) // 2 % 2
            steps += [Step(r, p, first), Step(r, p, 1 - first)]
    return steps


def _server_wait(m: Measurement) -> float | None:
    """The TTFT less the network's share (connection + one round trip): the server's queue and prefill."""
    network = m.network_s
    return None if m.ttft_s is None or network is None else max(0.0, m.ttft_s - network)


@dataclass(frozen=True, slots=True)
class Metric:
    """A number read from each measurement; `lower_is_better` says which way is faster, and
    `per_token` that a difference is one token's (so a smaller one matters: `compare_verdict`)."""

    key: str
    title: str
    unit: str  # "s" or "tok/s"
    read: Callable[[Measurement], float | None]
    lower_is_better: bool = True
    per_token: bool = False


# A reasoning model's three (docs/timing.md): the answer's first token (the first token's, for a
# model without reasoning), the streamed thinking before it, hidden thinking's estimate.
REASONING_KEYS = ("answer_ttft_s", "thinking_s", "thinking_estimated_s")

METRICS: tuple[Metric, ...] = (
    Metric("ttft_s", "TTFT", "s", lambda m: m.ttft_s),
    Metric("answer_ttft_s", "first answer token", "s", lambda m: m.answer_ttft_s),
    Metric("thinking_s", "thinking", "s", lambda m: m.thinking_s),
    Metric("thinking_estimated_s", "~hidden thinking", "s", lambda m: m.thinking_estimated_s),
    Metric("tpot_s", "TPOT", "s", lambda m: m.tpot_s, per_token=True),
    Metric("tokens_per_s", "tok/s", "tok/s", lambda m: m.tokens_per_s, lower_is_better=False, per_token=True),
    Metric("network_s", "network", "s", lambda m: m.network_s),
    Metric("server_wait_s", "server wait", "s", _server_wait),
    Metric("total_s", "total", "s", lambda m: m.total_s),
)


def values_of(samples: Sequence[Sample], target: int, metric: Metric) -> list[float]:
    """The metric's values over the target's successful requests."""
    out = []
    for s in samples:
        if s.step.target == target and s.measurement.ok:
            value = metric.read(s.measurement)
            if value is not None:
                out.append(value)
    return out


def pairs_of(samples: Sequence[Sample], metric: Metric, prompt: int | None = None) -> list[tuple[float, float]]:
    """(A, B) values of the same prompt in the same round, where both succeeded and have the metric."""
    found: dict[tuple[int, int], list[float | None]] = {}
    for s in samples:
        if prompt is not None and s.step.prompt != prompt:
            continue
        slot = found.setdefault((s.step.round, s.step.prompt), [None, None])
        slot[s.step.target] = metric.read(s.measurement) if s.measurement.ok else None
    return [(a, b) for a, b in found.values() if a is not None and b is not None]
