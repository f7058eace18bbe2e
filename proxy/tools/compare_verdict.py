"""Whether a difference `taotrace compare` measured matters: the statistics, then two thresholds. Pure.

The bootstrap (`compare_stats`) says whether a difference is more than noise, and with enough
pairs even 0.015 ms is. So a difference that is more than noise matters only when it also
reaches both thresholds:

- absolute: `duration_s` for a request's durations (TTFT, network, server wait, total),
  `per_token_s` for TPOT and tokens/s (a rate compared as its time per token, 1 / rate);
- relative: |B − A| / max(A, B), the share of the slower side's time that the faster side saves
  (for tokens/s the larger rate is the faster side, and the share is the same as that of the
  time per token). It is 1 − 1/factor for the factor the report prints.

A difference equal to a threshold reaches it. The verdicts, in the order they are decided:

    too_few_pairs -> not_significant -> below_threshold -> faster
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.tools.compare_plan import LABELS, Metric
from proxy.tools.compare_stats import Difference

__all__ = ["Decision", "Thresholds", "Verdict", "decide"]

Verdict = Literal["too_few_pairs", "not_significant", "below_threshold", "faster"]

# Medians of measured floats land on a threshold only approximately (0.105 - 0.100 is
# 0.004999…): within this share of it, a difference counts as reaching it.
_EDGE = 1e-9


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The smallest difference that matters: absolute in seconds (a request's durations; per
    token), and relative (a fraction of the larger median). 0 turns one off."""

    duration_s: float
    per_token_s: float
    relative: float

    def absolute(self, metric: Metric) -> float:
        return self.per_token_s if metric.per_token else self.duration_s


@dataclass(frozen=True, slots=True)
class Decision:
    """One measure's verdict and the numbers behind it. `faster` names the side a difference
    that is more than noise favours, even one below the thresholds; `size_s` is |B − A| in
    seconds (per token for TPOT and tokens/s; None when a rate is 0), `share` |B − A| / max(A, B)."""

    verdict: Verdict
    faster: str | None
    size_s: float | None
    min_size_s: float
    above_absolute: bool
    share: float
    min_share: float
    above_relative: bool

    @property
    def matters(self) -> bool:
        return self.verdict == "faster"


def _reaches(value: float, threshold: float) -> bool:
    return value >= threshold * (1.0 - _EDGE)


def decide(diff: Difference, metric: Metric, thresholds: Thresholds) -> Decision:
    """The verdict on one measure's paired difference."""
    a, b = diff.median_a, diff.median_b
    min_size = thresholds.absolute(metric)
    size: float | None
    if metric.unit != "tok/s":
        size = abs(b - a)
        above_absolute = _reaches(size, min_size)
    elif a > 0 and b > 0:
        size = abs(1.0 / a - 1.0 / b)
        above_absolute = _reaches(size, min_size)
    else:  # no tokens per second on one side: each token takes forever there
        size = None
        above_absolute = a != b
    larger = max(abs(a), abs(b))
    share = abs(b - a) / larger if larger else 0.0
    above_relative = _reaches(share, thresholds.relative)
    faster = None
    if diff.significant:
        b_better = b < a if metric.lower_is_better else b > a
        faster = LABELS[1] if b_better else LABELS[0]
    verdict: Verdict
    if not diff.enough:
        verdict = "too_few_pairs"
    elif not diff.significant:
        verdict = "not_significant"
    elif above_absolute and above_relative:
        verdict = "faster"
    else:
        verdict = "below_threshold"
    return Decision(verdict, faster, size, min_size, above_absolute, share, thresholds.relative, above_relative)
