"""A per-token series (inter-token gaps, chunk gaps, relay times) counted into a histogram's
buckets once, where the request was served. Pure.

With `--workers`, a long stream's series cross to the supervisor as a `Binned` instead of one
float per token: the worker sorts and counts them (the work its histograms would do), and the
supervisor adds a handful of bucket counts where it would build, sort and free every float
(`tests/bench/supervisor_records.py --micro`). The live view's bars of a stream's gaps travel
with it, already compacted to `MAX_GAPS`.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MAX_GAPS", "Binned", "bin_series", "bucket_pairs", "compact_gaps"]

MAX_GAPS = 256  # bars of a stream's gaps the live view keeps (the largest of each run of k gaps)


@dataclass(frozen=True, slots=True)
class Binned:
    """A series counted into the buckets of `edges` (bisect_left's rule, as Prometheus and
    OpenTelemetry: bucket i holds the values v <= edges[i] not in an earlier one, bucket
    len(edges) the rest), with its count, sum (Python's `sum`, as the histograms take it), least
    and largest. `kept`: the series compacted for the live view (`compact_gaps`), each bar the
    largest of `per_bar` consecutive values, as packed doubles (`bars()`): no float objects are
    made for them until the view shows them; empty for a series the view does not show."""

    edges: tuple[float, ...]
    buckets: tuple[int, ...]  # (bucket index, count) pairs, flattened, for the buckets that got any
    count: int
    sum: float
    low: float
    high: float
    kept: bytes = b""
    per_bar: int = 1

    def __len__(self) -> int:
        return self.count

    def bars(self) -> tuple[float, ...]:
        """The live view's bars (see `kept`)."""
        return tuple(memoryview(self.kept).cast("d"))

    def pairs(self) -> zip[tuple[int, int]]:
        """(bucket index, count) for each bucket that got values."""
        it = iter(self.buckets)
        return zip(it, it, strict=True)


def bin_series(values: Sequence[float], edges: tuple[float, ...], keep: bool = False) -> Binned | None:
    """`values` counted into `edges`' buckets; None when one of them is negative, infinite or NaN
    (those are sent as they are: each histogram has its own rule for them). `keep`: with the live
    view's bars (`compact_gaps`)."""
    ordered = sorted(values)
    total = sum(values)
    if not ordered or not (ordered[0] >= 0 and math.isfinite(total)):
        return None
    buckets = bucket_pairs(ordered, edges)
    kept, per_bar = compact_gaps(tuple(values), MAX_GAPS) if keep else ((), 1)
    return Binned(
        edges, tuple(buckets), len(ordered), total, ordered[0], ordered[-1], array("d", kept).tobytes(), per_bar
    )


def bucket_pairs(ordered: Sequence[float], edges: tuple[float, ...]) -> list[int]:
    """(bucket index, count) pairs, flattened, for the buckets of `edges` that sorted, NaN-free
    `ordered` fills (bisect_left's rule): values <= edges[i] minus those <= edges[i-1], one
    bisect per bucket rather than one per value."""
    pairs: list[int] = []
    below = 0
    n = len(ordered)
    for i, edge in enumerate(edges):
        upto = bisect_right(ordered, edge, below)
        if upto > below:
            pairs += (i, upto - below)
            below = upto
            if below == n:
                return pairs
    if below < n:
        pairs += (len(edges), n - below)
    return pairs


def compact_gaps(itl: tuple[float, ...], cap: int) -> tuple[tuple[float, ...], int]:
    """At most `cap` gaps: the largest of each run of k consecutive ones, and k."""
    n = len(itl)
    if n <= cap:
        return itl, 1
    k = -(-n // cap)
    full = n - n % k
    out = list(map(max, zip(*[iter(itl[:full])] * k, strict=True)))  # C loops: no Python step per gap
    if full < n:
        out.append(max(itl[full:]))
    return tuple(out), k
