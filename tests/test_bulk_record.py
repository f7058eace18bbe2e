"""`record_many` leaves the SDK's histograms exactly as one `Histogram.record` per value would."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider, TraceBasedExemplarFilter
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

from proxy.telemetry import sdk_internals
from proxy.telemetry.sdk_internals import BulkRecorder

BOUNDS = [0.001, 0.01, 0.1, 1.0, 10.0]


def provider(temporality: AggregationTemporality, exemplars: Any) -> tuple[Any, InMemoryMetricReader]:
    reader = InMemoryMetricReader(preferred_temporality={SdkHistogram: temporality})
    views = [View(instrument_name="h", aggregation=ExplicitBucketHistogramAggregation(BOUNDS))]
    mp = MeterProvider([reader], views=views, exemplar_filter=exemplars)
    return mp.get_meter("t").create_histogram("h", unit="s"), reader


def points(reader: InMemoryMetricReader) -> list[tuple[object, ...]]:
    data = reader.get_metrics_data()
    if data is None:
        return []
    out = []
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                p: Any
                for p in m.data.data_points:
                    out.append((sorted(p.attributes.items()), p.count, round(p.sum, 9), p.bucket_counts, p.min, p.max))
    return sorted(out)


@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])
@pytest.mark.parametrize("exemplars", [AlwaysOffExemplarFilter(), TraceBasedExemplarFilter()])
def test_same_points_as_one_record_per_value(temporality: AggregationTemporality, exemplars: Any) -> None:
    rng = random.Random(7)
    record_many = BulkRecorder().record
    one, one_reader = provider(temporality, exemplars)
    bulk, bulk_reader = provider(temporality, exemplars)
    attribute_sets: list[dict[str, str | int]] = [{"a": "x", "n": 1}, {"a": "y", "n": 1}, {}]
    for _round in range(3):  # several collections: delta resets, cumulative keeps adding
        for _ in range(20):
            attrs = rng.choice(attribute_sets)
            values = [rng.choice([0.0, 0.001, 10.0, 99.0, rng.random() * 2]) for _ in range(rng.randrange(0, 9))]
            for v in values:
                one.record(v, attrs)
            record_many(bulk, values, attrs)
        assert points(bulk_reader) == points(one_reader)
    # the direct path is taken exactly when the SDK would offer no exemplars
    assert (sdk_internals._matches(bulk) is not None) == isinstance(exemplars, AlwaysOffExemplarFilter)


def test_values_the_sdk_refuses_are_refused_alike() -> None:
    one, one_reader = provider(AggregationTemporality.CUMULATIVE, AlwaysOffExemplarFilter())
    bulk, bulk_reader = provider(AggregationTemporality.CUMULATIVE, AlwaysOffExemplarFilter())
    record_many = BulkRecorder().record
    for values in ([0.5, 0.2], [-1.0, 0.3], [float("nan"), 0.4], [0.6]):
        for v in values:
            one.record(v, {"k": "v"})
        record_many(bulk, values, {"k": "v"})
    assert points(bulk_reader) == points(one_reader)
    assert points(bulk_reader)[0][1] == 5  # the negative and the NaN were dropped
