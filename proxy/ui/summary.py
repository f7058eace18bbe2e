"""The live view's overview: the last 15 minutes in 30-second buckets. Pure; the caller owns the clock.

Each bucket counts requests, errors by `error_type`, the time spent in each phase, and per
model a log-scale histogram of TTFT and of TPOT (buckets 10 % wide, so a percentile read from
one is within ±5 % of the exact value). While a histogram holds at most `EXACT_SAMPLES` values
it also keeps them, and its percentiles are exact (one request's TTFT is shown as measured, not
as its bucket's middle); beyond that, a percentile is clamped to the exact minimum and maximum.
Memory is bounded by buckets × models, and models per bucket are capped (`other` beyond), since
anyone can invent model names.

A window's buckets can be handed over as plain values (`state`) and added to another window
(`merge`): counts, sums and histograms add, so a group's summary is the one a single window fed
every worker's requests would give (percentiles are read from the merged histograms, never
averaged).
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proxy.exchange.record import RequestRecord, model_label

__all__ = ["BUCKET_WIDTH", "EXACT_SAMPLES", "MAX_MODELS", "PHASES", "QUANTILES", "BucketState", "Window"]

BUCKET_S = 30.0
WINDOW_S = 900.0
MAX_MODELS = 10
QUANTILES = (0.5, 0.95, 0.99)
_KEYS = tuple(f"p{round(q * 100)}" for q in QUANTILES)  # "p50", "p95", "p99"
PHASES = ("network", "prefill_wait", "decode", "tail", "response")  # response: a non-streaming answer
BUCKET_WIDTH = 0.10  # each histogram bucket is 10 % wider than the one before
EXACT_SAMPLES = 32  # up to this many values per histogram are also kept as they are
_GROWTH = 1.0 + BUCKET_WIDTH
_PER_LOG = 1.0 / math.log(_GROWTH)


# A histogram as plain values: counts per log bucket, its values while it keeps them, min, max.
HistState = tuple[dict[int, int], "list[float] | None", float, float]
# A bucket of the window as plain values: start, requests, errors by type, seconds per phase, and
# per model its requests and its TTFT and TPOT histograms.
BucketState = tuple[float, int, dict[str, int], list[float], dict[str, tuple[int, HistState, HistState]]]


def _index(value: float) -> int:
    return math.floor(math.log(value) * _PER_LOG)


class _Hist:
    """A log histogram, its exact minimum and maximum, and its values while they are few."""

    __slots__ = ("counts", "hi", "lo", "values")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.values: array[float] | None = array("d")  # None once more than EXACT_SAMPLES came
        self.lo = math.inf
        self.hi = -math.inf

    def add(self, value: float) -> None:
        i = _index(value)
        self.counts[i] = self.counts.get(i, 0) + 1
        self.lo = min(self.lo, value)
        self.hi = max(self.hi, value)
        values = self.values
        if values is not None:
            if len(values) < EXACT_SAMPLES:
                values.append(value)
            else:
                self.values = None

    def state(self) -> HistState:
        return dict(self.counts), None if self.values is None else list(self.values), self.lo, self.hi

    @classmethod
    def of(cls, state: HistState) -> _Hist:
        hist = cls()
        counts, values, hist.lo, hist.hi = state
        hist.counts = dict(counts)
        hist.values = None if values is None else array("d", values)
        return hist

    def merge(self, other: _Hist) -> None:
        for k, n in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + n
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)
        if (
            self.values is not None
            and other.values is not None
            and len(self.values) + len(other.values) <= EXACT_SAMPLES
        ):
            self.values.extend(other.values)
        else:
            self.values = None

    def quantiles(self) -> list[float | None]:
        """p50, p95, p99: nearest rank over the values when all are kept; else the geometric
        middle of the bucket each falls in, clamped to the exact minimum and maximum."""
        if self.values is not None:
            ordered = sorted(self.values)
            n = len(ordered)
            return [ordered[max(0, math.ceil(q * n) - 1)] if n else None for q in QUANTILES]
        counts = self.counts
        total = sum(counts.values())
        out: list[float | None] = []
        keys = sorted(counts)
        for q in QUANTILES:
            rank = q * total
            seen = 0
            for k in keys:
                seen += counts[k]
                if seen >= rank:
                    out.append(min(self.hi, max(self.lo, _GROWTH ** (k + 0.5))))
                    break
        return out


@dataclass(slots=True)
class _Model:
    requests: int = 0
    ttft: _Hist = field(default_factory=_Hist)
    tpot: _Hist = field(default_factory=_Hist)


@dataclass(slots=True)
class _Bucket:
    start: float
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    phases: list[float] = field(default_factory=lambda: [0.0] * len(PHASES))
    models: dict[str, _Model] = field(default_factory=dict)
    points: dict[str, Any] | None = None  # the percentiles, computed once the bucket is closed


class Window:
    """Per-bucket aggregates of the finished requests of the last `window_s` seconds."""

    def __init__(self, bucket_s: float = BUCKET_S, window_s: float = WINDOW_S, max_models: int = MAX_MODELS) -> None:
        self.bucket_s = bucket_s
        self.window_s = window_s
        self.max_models = max_models
        self._buckets: deque[_Bucket] = deque(maxlen=max(1, math.ceil(window_s / bucket_s)))

    def _bucket(self, now: float) -> _Bucket:
        start = now - now % self.bucket_s
        buckets = self._buckets
        if not buckets or buckets[-1].start < start:
            buckets.append(_Bucket(start))
        return buckets[-1]

    def _model(self, b: _Bucket, name: str) -> _Model:
        """The bucket's model `name`, or `other` once it holds `max_models`."""
        model = b.models.get(name)
        if model is None:
            if len(b.models) >= self.max_models:
                name = "other"
                model = b.models.get(name)
            if model is None:
                model = b.models[name] = _Model()
        return model

    def add(self, record: RequestRecord, now: float) -> None:
        b = self._bucket(now)
        b.requests += 1
        if record.error_type:
            b.errors[record.error_type] = b.errors.get(record.error_type, 0) + 1
        t = record.timing
        phases = b.phases
        network = t.network or 0.0
        phases[0] += network
        if t.ttft is not None:
            phases[1] += t.prefill_wait or 0.0
            phases[2] += t.decode or 0.0
            phases[3] += t.duration - t.ttft - (t.decode or 0.0)
        else:
            phases[4] += t.duration - network
        model = self._model(b, model_label(record.model))
        model.requests += 1
        if t.ttft is not None and t.ttft > 0:
            model.ttft.add(t.ttft)
        if t.tpot is not None and t.tpot > 0:
            model.tpot.add(t.tpot)

    def state(self, now: float) -> list[BucketState]:
        """The buckets of the last `window_s` seconds as plain values, for `merge`."""
        horizon = now - self.window_s
        return [
            (
                b.start,
                b.requests,
                dict(b.errors),
                list(b.phases),
                {name: (m.requests, m.ttft.state(), m.tpot.state()) for name, m in b.models.items()},
            )  # fmt: skip
            for b in self._buckets
            if b.start + self.bucket_s > horizon
        ]

    def merge(self, states: Iterable[BucketState]) -> None:
        """Another window's buckets (`state`), added to this one's bucket by bucket."""
        found = {b.start: b for b in self._buckets}
        for start, requests, errors, phases, models in states:
            b = found.get(start)
            if b is None:
                b = found[start] = _Bucket(start)
            b.points = None
            b.requests += requests
            for kind, n in errors.items():
                b.errors[kind] = b.errors.get(kind, 0) + n
            for j, seconds in enumerate(phases):
                b.phases[j] += seconds
            for name, (n, ttft, tpot) in models.items():
                model = self._model(b, name)
                model.requests += n
                model.ttft.merge(_Hist.of(ttft))
                model.tpot.merge(_Hist.of(tpot))
        self._buckets.clear()
        self._buckets.extend(sorted(found.values(), key=lambda b: b.start))  # the oldest fall off the deque

    @staticmethod
    def _points(b: _Bucket) -> dict[str, Any]:
        return {
            name: {"ttft": m.ttft.quantiles(), "tpot": m.tpot.quantiles(), "requests": m.requests}
            for name, m in b.models.items()
        }

    def prepare(self, now: float, limit: int = 4) -> bool:
        """Compute the percentiles of up to `limit` closed buckets; True once none is left.

        Lets a caller on the event loop spread the first `snapshot` of a full window (a few ms
        at 10 models) over several turns of the loop.
        """
        todo = [b for b in self._buckets if b.points is None and now >= b.start + self.bucket_s]
        for b in todo[:limit]:
            b.points = self._points(b)
        return len(todo) <= limit

    def snapshot(self, now: float) -> dict[str, Any]:
        """The JSON of `/api/summary` (minus what the caller adds): series per model, totals."""
        horizon = now - self.window_s
        buckets = [b for b in self._buckets if b.start + self.bucket_s > horizon]
        times = [b.start for b in buckets]
        models: dict[str, dict[str, Any]] = {}
        totals: dict[str, _Model] = {}
        errors: dict[str, int] = {}
        phases = [0.0] * len(PHASES)
        rate: list[float] = []
        for i, b in enumerate(buckets):
            current = i == len(buckets) - 1 and now < b.start + self.bucket_s
            if current:
                points = self._points(b)  # still filling: recomputed each time
            else:
                if b.points is None:
                    b.points = self._points(b)
                points = b.points
            for name, p in points.items():
                series = models.get(name)
                if series is None:
                    series = models[name] = {
                        "ttft": {key: [None] * len(buckets) for key in _KEYS},
                        "tpot": {key: [None] * len(buckets) for key in _KEYS},
                        "requests": [0] * len(buckets),
                    }
                for kind in ("ttft", "tpot"):
                    per_key = series[kind]
                    for key, value in zip(_KEYS, p[kind], strict=True):
                        per_key[key][i] = value
                series["requests"][i] = p["requests"]
            for name, m in b.models.items():
                total = totals.get(name)
                if total is None:
                    total = totals[name] = _Model()
                total.requests += m.requests
                total.ttft.merge(m.ttft)
                total.tpot.merge(m.tpot)
            for kind, n in b.errors.items():
                errors[kind] = errors.get(kind, 0) + n
            for j, s in enumerate(b.phases):
                phases[j] += s
            elapsed = min(self.bucket_s, max(1.0, now - b.start)) if current else self.bucket_s
            rate.append(b.requests / elapsed)
        per_model = {
            name: {
                "requests": m.requests,
                "ttft": dict(zip(_KEYS, m.ttft.quantiles(), strict=True)),
                "tpot": dict(zip(_KEYS, m.tpot.quantiles(), strict=True)),
            }
            for name, m in sorted(totals.items())
        }
        return {
            "window_s": self.window_s,
            "bucket_s": self.bucket_s,
            "t": times,
            "series": models,
            "models": per_model,
            "requests_per_s": rate,
            "requests": sum(b.requests for b in buckets),
            "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])),
            "phases": dict(zip(PHASES, phases, strict=True)),
        }
