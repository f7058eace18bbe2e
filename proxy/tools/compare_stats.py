"""The numbers behind `taotrace compare`: percentiles and a paired bootstrap. Pure; the RNG is passed in.

Each request to target A is paired with the request to B that sent the same prompt in the same
round (sent next to each other, so drift in the network or the provider's load hits both). The
difference reported is median(B) − median(A) over the pairs; its confidence interval comes from
resampling the pairs with replacement (percentile bootstrap). An interval that contains 0 means
the data cannot tell the two apart.
"""

from __future__ import annotations

import math
import operator
import random
import statistics
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
# Each resample sorts every pair twice: above 500 pairs, fewer resamples (down to 200) keep the
# report within seconds; the interval's ends move by far less than its width.
BOOTSTRAP_WORK = 1_000_000
MIN_ITERATIONS = 200
CONFIDENCE = 0.95


MIN_PAIRS = 8  # fewer pairs than this: "too few pairs to tell", whatever the interval says


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
    resamples: int = 0

    @property
    def diff(self) -> float:
        return self.median_b - self.median_a

    @property
    def enough(self) -> bool:
        """At least `MIN_PAIRS`: below that a percentile bootstrap's interval is far too narrow
        (3 pairs of one server against itself called a winner 2 times in 8)."""
        return self.pairs >= MIN_PAIRS

    @property
    def significant(self) -> bool:
        """False with too few pairs, or when the interval spans 0: no significant difference."""
        return self.enough and not (self.low <= 0.0 <= self.high)

    @property
    def ratio(self) -> float | None:
        """median(B) / median(A); None when A's median is 0."""
        return self.median_b / self.median_a if self.median_a else None


def paired_difference(
    pairs: Sequence[tuple[float, float]],
    rng: random.Random,
    *,
    iterations: int | None = None,
    level: float = CONFIDENCE,
) -> Difference | None:
    """The difference of medians of (a, b) pairs and its interval; None without pairs.
    `iterations` by default: 2,000, fewer above 500 pairs (`BOOTSTRAP_WORK`)."""
    n = len(pairs)
    if n == 0:
        return None
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    if n == 1:
        return Difference(1, a[0], b[0], b[0] - a[0], b[0] - a[0], level)
    if iterations is None:
        iterations = max(MIN_ITERATIONS, min(BOOTSTRAP_ITERATIONS, BOOTSTRAP_WORK // n))
    population = range(n)
    diffs = []
    for _ in range(iterations):
        take = operator.itemgetter(*rng.choices(population, k=n))  # n >= 2: it returns a tuple
        diffs.append(statistics.median(take(b)) - statistics.median(take(a)))
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = percentile(diffs, tail), percentile(diffs, 100.0 - tail)
    return Difference(n, median(a), median(b), low, high, level, iterations)
