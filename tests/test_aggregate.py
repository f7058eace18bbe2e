"""Our aggregation (proxy/telemetry/aggregate.py): the bucket rule, batches equal to one-by-one
recording however they are split, the values refused, temporality and the cardinality bound.
(That its output equals the SDK's own aggregation is tests/test_otlp_metrics.py.)"""

from __future__ import annotations

import threading
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.export import AggregationTemporality as Temporality
from opentelemetry.sdk.metrics.export import HistogramDataPoint, Metric

from proxy.telemetry.aggregate import OVERFLOW, CounterInstrument, HistogramInstrument, temporality_from_env

BOUNDS = (0.001, 0.01, 0.1, 1.0, 10.0)
values_st = st.lists(
    st.one_of(st.sampled_from([*BOUNDS, 0.0, 1e9]), st.floats(min_value=0, max_value=1e6, allow_nan=False)),
    max_size=60,
)


TEMPORALITIES = (Temporality.DELTA, Temporality.CUMULATIVE)


def point(data: Metric | None) -> HistogramDataPoint:
    assert data is not None
    (p,) = data.data.data_points
    assert isinstance(p, HistogramDataPoint)
    return p


def point_list(data: Metric | None) -> list[Any]:
    """The points, histogram or sum."""
    assert data is not None
    return list(data.data.data_points)


def test_a_value_on_a_bound_goes_in_that_bound_s_bucket() -> None:
    """bisect_left, as OTel specifies: bucket i holds (bounds[i-1], bounds[i]]."""
    h = HistogramInstrument("h", "s", "", BOUNDS)
    for v in (0.0, 0.001, 0.0010001, 10.0, 10.5):
        h.record(v, {})
    p = point(h.collect())
    assert p.bucket_counts == (2, 1, 0, 0, 1, 1) and p.explicit_bounds == BOUNDS
    assert (p.count, p.min, p.max) == (5, 0.0, 10.5)


@given(values=values_st, cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=8))
def test_any_split_into_batches_aggregates_like_one_by_one(values: list[float], cuts: list[int]) -> None:
    one, batched = HistogramInstrument("h", "s", "", BOUNDS), HistogramInstrument("h", "s", "", BOUNDS)
    for v in values:
        one.record(v, {"k": "v"})
    edges = sorted({0, len(values), *(c for c in cuts if c <= len(values))})
    for a, b in zip(edges, edges[1:], strict=False):
        batched.record_many(values[a:b], {"k": "v"})
    if not values:
        assert one.collect() is None and batched.collect() is None
        return
    mine, theirs = point(batched.collect()), point(one.collect())
    # Same counts, count, min, max, and the same float sum (added value by value in both).
    assert (mine.bucket_counts, mine.count, mine.sum, mine.min, mine.max) == (
        theirs.bucket_counts,
        theirs.count,
        theirs.sum,
        theirs.min,
        theirs.max,
    )


def test_negative_and_non_finite_values_are_refused_and_counted() -> None:
    h = HistogramInstrument("h", "s", "", BOUNDS)
    h.record_many([0.5, -1.0, float("nan"), float("inf"), 0.2], {})
    h.record(-0.0, {})  # -0.0 >= 0: taken, as the SDK takes it
    p = point(h.collect())
    assert (p.count, h.rejected) == (3, 3)
    c = CounterInstrument("c", "{token}", "")
    for amount in (3, -1, float("nan"), 4):
        c.add(amount, {})
    data = c.collect()
    assert data is not None and [p.value for p in data.data.data_points] == [7] and c.rejected == 2


def test_delta_starts_afresh_and_leaves_out_quiet_sets_cumulative_keeps_them() -> None:
    for temporality in TEMPORALITIES:
        h = HistogramInstrument("h", "s", "", BOUNDS, temporality)
        h.record(0.5, {"a": 1})
        h.record(0.5, {"a": 2})
        h.collect()
        h.record(0.5, {"a": 1})
        data = h.collect()
        assert data is not None and data.data.aggregation_temporality is temporality
        counts = {dict(p.attributes)["a"]: p.count for p in point_list(data)}
        assert counts == ({1: 1} if temporality is Temporality.DELTA else {1: 2, 2: 1})


def test_the_cardinality_bound_sends_new_sets_to_the_overflow_set() -> None:
    """At most `limit` points: limit - 1 sets of their own, then the overflow set; the total is kept.
    Sets seen before the bound keep their own point."""
    for temporality in TEMPORALITIES:
        h = HistogramInstrument("h", "s", "", BOUNDS, temporality, limit=4)
        c = CounterInstrument("c", "1", "", temporality, limit=4)
        for i in range(10):
            h.record_many([0.5, 0.5], {"i": i})
            c.add(2, {"i": i})
        h.record(0.5, {"i": 0})
        c.add(1, {"i": 0})
        for data in (h.collect(), c.collect()):
            assert data is not None
            seen = {tuple(p.attributes.items()): p for p in point_list(data)}
            assert list(seen) == [(("i", 0),), (("i", 1),), (("i", 2),), tuple(OVERFLOW.items())]
            totals = [p.count if isinstance(p, HistogramDataPoint) else p.value for p in seen.values()]
            assert totals == [3, 2, 2, 14]
        if temporality is Temporality.DELTA:  # a new interval: room again
            h.record(0.5, {"i": 9})
            assert [dict(p.attributes) for p in point_list(h.collect())] == [{"i": 9}]


def test_attribute_order_does_not_make_a_new_set() -> None:
    h = HistogramInstrument("h", "s", "", BOUNDS)
    h.record(0.5, {"a": 1, "b": "x"})
    h.record(0.5, {"b": "x", "a": 1})
    assert point(h.collect()).count == 2


def counted(data: Metric | None) -> int:
    return sum(p.count for p in data.data.data_points if isinstance(p, HistogramDataPoint)) if data else 0


def test_recording_while_collecting_loses_nothing() -> None:
    h = HistogramInstrument("h", "s", "", BOUNDS, Temporality.DELTA)
    total = 0
    stop = threading.Event()

    def collect() -> None:
        nonlocal total
        while not stop.is_set():
            total += counted(h.collect())

    collector = threading.Thread(target=collect)
    collector.start()
    for _ in range(2000):
        h.record_many([0.1, 0.2, 0.3], {"k": 1})
    stop.set()
    collector.join()
    total += counted(h.collect())
    assert total == 6000


def test_temporality_preference() -> None:
    key = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
    assert temporality_from_env({}) is Temporality.CUMULATIVE
    assert temporality_from_env({key: "cumulative"}) is Temporality.CUMULATIVE
    assert temporality_from_env({key: " Delta "}) is Temporality.DELTA
    assert temporality_from_env({key: "lowmemory"}) is Temporality.DELTA  # counters and histograms: delta
    assert temporality_from_env({key: "nonsense"}) is Temporality.CUMULATIVE
