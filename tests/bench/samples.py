"""Pure reductions of the benchmark's samples: percentiles, and the proxy's first-token lag.

The lag is how long after the upstream wrote a stream's first token the proxy stamped it: the
proxy's `first_token_monotonic` (its live view's rows) minus the upstream's own instant (the bench
upstream's `/bench/first_tokens`), matched by trace id; the last token's the same way
(`last_token_monotonic`, `/bench/last_tokens`). Both are CLOCK_MONOTONIC seconds read in
different processes of one host, so the difference needs no clock offset.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["batch_spread", "first_token_lags", "lag_summary", "pct", "proxy_first_tokens"]

NS = 1e9


def pct(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), in the values' unit; NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def proxy_first_tokens(rows: Iterable[Mapping[str, object]], field: str = "first_token_monotonic") -> dict[str, float]:
    """trace id -> first-token instant (`field="last_token_monotonic"`: the last token's), from
    `/api/requests` rows (rows without either are skipped)."""
    out: dict[str, float] = {}
    for r in rows:
        tid, t = r.get("trace_id"), r.get(field)
        if isinstance(tid, str) and isinstance(t, (int, float)):
            out[tid] = float(t)
    return out


def first_token_lags(upstream: Mapping[str, float], proxy: Mapping[str, float]) -> list[int]:
    """Proxy instant minus upstream write, in ns, for every trace id the two sides share."""
    return [round((proxy[tid] - t) * NS) for tid, t in upstream.items() if tid in proxy]


def batch_spread(upstream: Mapping[str, float], proxy: Mapping[str, float]) -> tuple[int, int] | None:
    """For one batch of streams started together: how far apart (ns) the upstream wrote their first
    tokens, and how far apart the proxy stamped them (first to last). A stamp spread much wider
    than the write spread means the proxy took the simultaneous arrivals one after another.
    None with fewer than two shared trace ids."""
    shared = [tid for tid in upstream if tid in proxy]
    if len(shared) < 2:
        return None
    ups = [upstream[t] for t in shared]
    pxs = [proxy[t] for t in shared]
    return round((max(ups) - min(ups)) * NS), round((max(pxs) - min(pxs)) * NS)


def lag_summary(lags_ns: Sequence[int], expected: int) -> dict[str, float | int | None]:
    """p50 / p95 / p99 / max in ms, how many matched and of how many (`expected`: streams that
    had a first token). Percentiles are None without samples."""

    def ms(q: float) -> float | None:
        return pct(lags_ns, q) / 1e6 if lags_ns else None

    return {
        "matched": len(lags_ns),
        "expected": expected,
        "p50_ms": ms(0.5),
        "p95_ms": ms(0.95),
        "p99_ms": ms(0.99),
        "max_ms": max(lags_ns) / 1e6 if lags_ns else None,
    }
