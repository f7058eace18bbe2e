"""The numbers behind `taotrace compare`: percentiles and a paired bootstrap. Pure; the RNG is passed in.

Each request to target A is paired with the request to B that sent the same prompt in the same
round (sent next to each other, so drift in the network or the provider's load hits both). The
difference reported is median(B) − median(A) over the pairs; its confidence interval comes from
resampling the pairs with replacement (percentile bootstrap). An interval that contains 0 means
the data cannot tell the two apart.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BOOTSTRAP_ITERATIONS",
    "CONFIDENCE",
    "Difference",
    "Spread",
    "median",
    "paired_difference",
    "percentile",
    "spread",
]

BOOTSTRAP_ITERATIONS = 2000
CONFIDENCE = 0.95


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100) by linear interpolation between the closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


@dataclass(frozen=True, slots=True)
class Spread:
    """How one metric of one target spread: sample count, median and 95th percentile."""

    n: int
    p50: float
    p95: float


def spread(values: Sequence[float]) -> Spread | None:
    """None when there are no values."""
    if not values:
        return None
    return Spread(len(values), percentile(values, 50.0), percentile(values, 95.0))


@dataclass(frozen=True, slots=True)
class Difference:
    """median(B) − median(A) over paired samples, with its bootstrap confidence interval."""

    pairs: int
    median_a: float
    median_b: float
    low: float
    high: float
    level: float

    @property
    def diff(self) -> float:
        return self.median_b - self.median_a

    @property
    def significant(self) -> bool:
        """False when the interval spans 0: no significant difference."""
        return not (self.low <= 0.0 <= self.high)

    @property
    def ratio(self) -> float | None:
        """median(B) / median(A); None when A's median is 0."""
        return self.median_b / self.median_a if self.median_a else None


def paired_difference(
    pairs: Sequence[tuple[float, float]],
    rng: random.Random,
    *,
    iterations: int = BOOTSTRAP_ITERATIONS,
    level: float = CONFIDENCE,
) -> Difference | None:
    """The difference of medians of (a, b) pairs and its interval; None without pairs."""
    n = len(pairs)
    if n == 0:
        return None
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    diffs = []
    for _ in range(iterations):
        idx = [rng.randrange(n) for _ in range(n)]
        diffs.append(median([b[i] for i in idx]) - median([a[i] for i in idx]))
    tail = (1.0 - level) / 2.0 * 100.0
    return Difference(n, median(a), median(b), percentile(diffs, tail), percentile(diffs, 100.0 - tail), level)
