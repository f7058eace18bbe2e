"""Our own metric aggregation: explicit-bucket histograms and monotonic counters, per attribute set.

What the OpenTelemetry metrics SDK specifies for these two instruments, and no more:

- a histogram value v goes in the first bucket whose upper bound is >= v (`bisect_left`; bucket i
  holds (bounds[i-1], bounds[i]], the last one everything above); count, sum, min and max;
- a counter adds; only non-negative, finite values are taken (others are dropped and counted in
  `rejected`, as the SDK drops them);
- temporality: cumulative keeps every attribute set's state and its start time; delta hands over
  what was recorded since the last collection and starts afresh;
- a cardinality bound per instrument (`CARDINALITY_LIMIT` points at most): once limit - 1
  attribute sets exist, measurements for a new one go to the overflow set
  `{otel.metric.overflow: true}`, so the total is right while the attributes are lost.

`record_many` adds a stream's many chunk gaps in one call: one lookup and one lock for all of
them. An `AttributeSet` carries its lookup key, made once, for a caller that records the same set
often (`record_set`, `record_many_set`, `add_set`). Instruments may be recorded from one thread while another collects (a lock each). The clock
(Unix ns) is injected. A collection is the SDK's own export data (`opentelemetry.sdk.metrics.export`:
`Metric`, `ScopeMetrics`), which its exporters encode and send (`metric_pipeline.py`).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from operator import add

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

__all__ = [
    "CARDINALITY_LIMIT",
    "OVERFLOW",
    "AttributeSet",
    "CounterInstrument",
    "HistogramInstrument",
    "Meter",
    "temporality_from_env",
]

Attributes = Mapping[str, "str | int | bool"]
CARDINALITY_LIMIT = 2000  # the spec's default, points per instrument including the overflow one
OVERFLOW: dict[str, str | int | bool] = {"otel.metric.overflow": True}
_SORTED_FROM = 8  # batches longer than this are counted per bucket from the sorted values
_Key = frozenset[tuple[str, object]]
_OVERFLOW_KEY: _Key = frozenset(OVERFLOW.items())


def _added_in_order(values: Iterable[float], start: float) -> float:
    """`start` plus each value, one at a time in the given order: the float sum one-by-one
    recording gives (the SDK's)."""
    return reduce(add, values, start)


# Before 3.12 the built-in sum adds floats just so (a C double, in order), at a seventh of reduce's
# cost; from 3.12 it compensates the rounding, a different float than the SDK's.
_in_order: Callable[[Iterable[float], float], float] = sum if sys.version_info < (3, 12) else _added_in_order


@dataclass(frozen=True, slots=True)
class AttributeSet:
    """Attributes and their lookup key, made once (`of`) for a set recorded again and again."""

    attributes: Attributes
    key: _Key

    @classmethod
    def of(cls, attributes: Attributes) -> AttributeSet:
        return cls(attributes, frozenset(attributes.items()))


def temporality_from_env(env: Mapping[str, str]) -> AggregationTemporality:
    """OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE for our instruments (synchronous counters and
    histograms): `cumulative` (default) or `delta`; `lowmemory` is delta for both (the spec's table)."""
    choice = env.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "cumulative").strip().lower()
    return AggregationTemporality.DELTA if choice in ("delta", "lowmemory") else AggregationTemporality.CUMULATIVE


class _HistogramState:
    __slots__ = ("attributes", "count", "counts", "high", "low", "start_ns", "total")

    def __init__(self, attributes: Attributes, buckets: int, start_ns: int) -> None:
        self.attributes = attributes
        self.counts = [0] * buckets
        self.count = 0
        self.total = 0.0
        self.low = math.inf
        self.high = -math.inf
        self.start_ns = start_ns


class _SumState:
    __slots__ = ("attributes", "start_ns", "value")

    def __init__(self, attributes: Attributes, start_ns: int) -> None:
        self.attributes = attributes
        self.value: int | float = 0
        self.start_ns = start_ns


def _bucket_pairs(ordered: Sequence[float], bounds: tuple[float, ...]) -> list[int]:
    """(bucket index, count) pairs, flattened, for the buckets of `bounds` that sorted, NaN-free
    `ordered` fills (bisect_left's rule): values <= bounds[i] minus those <= bounds[i-1], one
    bisect per bucket rather than one per value."""
    pairs: list[int] = []
    below = 0
    n = len(ordered)
    for i, edge in enumerate(bounds):
        upto = bisect_right(ordered, edge, below)
        if upto > below:
            pairs += (i, upto - below)
            below = upto
            if below == n:
                return pairs
    if below < n:
        pairs += (len(bounds), n - below)
    return pairs


def _acceptable(values: Sequence[float]) -> Sequence[float]:
    """The values the SDK would take: non-negative and finite (NaN fails both comparisons)."""
    return [v for v in values if 0 <= v < math.inf]


class _Instrument:
    def __init__(
        self,
        name: str,
        unit: str,
        description: str,
        temporality: AggregationTemporality,
        clock: Callable[[], int],
        limit: int,
    ) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self.temporality = temporality
        self.rejected = 0  # negative or non-finite values dropped
        self._clock = clock
        self._limit = max(limit, 1)
        self._lock = threading.Lock()
        self._created_ns = clock()
        self._last_ns = self._created_ns  # the previous collection (delta points start there)

    def _key(self, states: Mapping[_Key, object], attributes: Attributes) -> tuple[_Key, Attributes]:
        """The attribute set's key, or the overflow set's once the bound is reached (lock held)."""
        key = frozenset(attributes.items())
        if key in states or len(states) < self._limit - 1:
            return key, attributes
        return _OVERFLOW_KEY, OVERFLOW

    def _start(self) -> int:
        # A point's start. Cumulative: when its set was first seen; delta: the previous collection.
        return self._last_ns if self.temporality is AggregationTemporality.DELTA else self._clock()


class HistogramInstrument(_Instrument):
    """An explicit-bucket histogram with the given upper `bounds` (ascending)."""

    def __init__(
        self,
        name: str,
        unit: str,
        description: str,
        bounds: Iterable[float],
        temporality: AggregationTemporality = AggregationTemporality.CUMULATIVE,
        *,
        clock: Callable[[], int] = time.time_ns,
        limit: int = CARDINALITY_LIMIT,
    ) -> None:
        super().__init__(name, unit, description, temporality, clock, limit)
        self.bounds = tuple(float(b) for b in bounds)
        self._states: dict[_Key, _HistogramState] = {}

    def _state(self, key: _Key, attributes: Attributes) -> _HistogramState:
        """The attribute set's state (`key`: its items as a frozenset), made on first use (lock held)."""
        states = self._states
        state = states.get(key)
        if state is None:
            key, attributes = self._key(states, attributes)
            state = states.get(key)
            if state is None:
                state = states[key] = _HistogramState(attributes, len(self.bounds) + 1, self._start())
        return state

    def record(self, value: float, attributes: Attributes) -> None:
        self._record(value, frozenset(attributes.items()), attributes)

    def record_set(self, value: float, attributes: AttributeSet) -> None:
        """`record` with the set's key made once."""
        self._record(value, attributes.key, attributes.attributes)

    def _record(self, value: float, key: _Key, attributes: Attributes) -> None:
        if not 0 <= value < math.inf:
            self.rejected += 1
            return
        with self._lock:
            state = self._state(key, attributes)
            state.counts[bisect_left(self.bounds, value)] += 1
            state.count += 1
            state.total += value
            if value < state.low:
                state.low = value
            if value > state.high:
                state.high = value

    def record_many(self, values: Sequence[float], attributes: Attributes) -> None:
        """Each of `values` recorded with `attributes`: one lookup and one lock for all of them."""
        self._record_many(values, frozenset(attributes.items()), attributes)

    def record_many_set(self, values: Sequence[float], attributes: AttributeSet) -> None:
        """`record_many` with the set's key made once."""
        self._record_many(values, attributes.key, attributes.attributes)

    def _record_many(self, values: Sequence[float], key: _Key, attributes: Attributes) -> None:
        if not values:
            return
        taken = values
        ordered = sorted(values)
        # The sorted values' first is the least (when none is NaN, which the sum tells): no min() pass.
        if not (ordered[0] >= 0 and math.isfinite(sum(values))):
            taken = _acceptable(values)
            self.rejected += len(values) - len(taken)
            if not taken:
                return
            ordered = sorted(taken)
        bounds = self.bounds
        with self._lock:
            state = self._state(key, attributes)
            counts = state.counts
            if len(ordered) <= _SORTED_FROM:
                for v in ordered:
                    counts[bisect_left(bounds, v)] += 1
            else:
                it = iter(_bucket_pairs(ordered, bounds))
                for i, n in zip(it, it, strict=True):
                    counts[i] += n
            # Added in the given order, one at a time (in C), as one-by-one recording would: the same float sum.
            state.total = _in_order(taken, state.total)
            state.count += len(ordered)
            if ordered[0] < state.low:
                state.low = ordered[0]
            if ordered[-1] > state.high:
                state.high = ordered[-1]

    def collect(self) -> Metric | None:
        """The points since the start (cumulative) or the previous collection (delta); None when there are none."""
        now = self._clock()
        bounds = self.bounds
        with self._lock:
            states = self._states
            if self.temporality is AggregationTemporality.DELTA:  # handed over: the next interval starts now
                self._states, self._last_ns = {}, now
            points = [
                HistogramDataPoint(
                    s.attributes, s.start_ns, now, s.count, s.total, tuple(s.counts), bounds, s.low, s.high
                )
                for s in states.values()
            ]
        if not points:
            return None
        return Metric(self.name, self.description, self.unit, HistogramData(points, self.temporality))


class CounterInstrument(_Instrument):
    """A monotonic sum."""

    def __init__(
        self,
        name: str,
        unit: str,
        description: str,
        temporality: AggregationTemporality = AggregationTemporality.CUMULATIVE,
        *,
        clock: Callable[[], int] = time.time_ns,
        limit: int = CARDINALITY_LIMIT,
    ) -> None:
        super().__init__(name, unit, description, temporality, clock, limit)
        self._states: dict[_Key, _SumState] = {}

    def add(self, amount: int | float, attributes: Attributes) -> None:
        self._add(amount, frozenset(attributes.items()), attributes)

    def add_set(self, amount: int | float, attributes: AttributeSet) -> None:
        """`add` with the set's key made once."""
        self._add(amount, attributes.key, attributes.attributes)

    def _add(self, amount: int | float, key: _Key, attributes: Attributes) -> None:
        if not 0 <= amount < math.inf:
            self.rejected += 1
            return
        with self._lock:
            states = self._states
            state = states.get(key)
            if state is None:
                key, attributes = self._key(states, attributes)
                state = states.get(key)
                if state is None:
                    state = states[key] = _SumState(attributes, self._start())
            state.value += amount

    def collect(self) -> Metric | None:
        """As `HistogramInstrument.collect`: a monotonic Sum."""
        now = self._clock()
        with self._lock:
            states = self._states
            if self.temporality is AggregationTemporality.DELTA:
                self._states, self._last_ns = {}, now
            points = [NumberDataPoint(s.attributes, s.start_ns, now, s.value) for s in states.values()]
        if not points:
            return None
        return Metric(self.name, self.description, self.unit, Sum(points, self.temporality, True))


class Meter:
    """The instruments of one instrumentation scope (name, version, schema URL), in creation order."""

    def __init__(
        self,
        name: str,
        version: str,
        schema_url: str,
        temporality: AggregationTemporality = AggregationTemporality.CUMULATIVE,
        *,
        clock: Callable[[], int] = time.time_ns,
        limit: int = CARDINALITY_LIMIT,
    ) -> None:
        self.name = name
        self.version = version
        self.schema_url = schema_url
        self.temporality = temporality
        self._clock = clock
        self._limit = limit
        self.instruments: list[HistogramInstrument | CounterInstrument] = []

    def histogram(self, name: str, unit: str, description: str, bounds: Iterable[float]) -> HistogramInstrument:
        h = HistogramInstrument(name, unit, description, bounds, self.temporality, clock=self._clock, limit=self._limit)
        self.instruments.append(h)
        return h

    def counter(self, name: str, unit: str, description: str) -> CounterInstrument:
        c = CounterInstrument(name, unit, description, self.temporality, clock=self._clock, limit=self._limit)
        self.instruments.append(c)
        return c

    def collect(self) -> ScopeMetrics | None:
        """Every instrument with points; None when none has any."""
        metrics = [m for m in (i.collect() for i in self.instruments) if m is not None]
        if not metrics:
            return None
        return ScopeMetrics(InstrumentationScope(self.name, self.version, self.schema_url), metrics, self.schema_url)
