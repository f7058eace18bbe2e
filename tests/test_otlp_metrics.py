"""Our aggregation against the OpenTelemetry SDK's, measurement for measurement.

The same measurements go to the SDK (`MeterProvider` + `InMemoryMetricReader`, the same views and
temporality, public API only) and to ours (`aggregate.py`, collected by `MetricPipeline` as the
SDK's export data); the library's OTLP encoder (what the exporters send) encodes both, and the
two requests, decoded with opentelemetry-proto, must be equal but for timestamps.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics as library_encode
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics import Counter as SdkCounter
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader, MetricsData, ResourceMetrics
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from proxy.telemetry.genai_metrics import BUCKETS, BUCKETS_SPEC_SECONDS, BUCKETS_SPEC_TOKENS
from proxy.telemetry.metric_pipeline import MetricPipeline
from proxy.telemetry.semconv import LATEST_METRICS, RELEASED_METRICS
from tests.otel_versions import SDK_REFUSES_NON_FINITE

RESOURCE = {"service.name": "taotrace", "service.version": "1.2.3", "deployment.environment": "test"}
# (scope schema URL, instrument name, kind, unit, bounds): both conventions' shapes, and ours.
INSTRUMENTS = [
    (RELEASED_METRICS.schema_url, RELEASED_METRICS.duration, "histogram", "s", BUCKETS_SPEC_SECONDS),
    (RELEASED_METRICS.schema_url, RELEASED_METRICS.tokens, "histogram", "{token}", BUCKETS_SPEC_TOKENS),
    (RELEASED_METRICS.schema_url, "taotrace.phase.duration", "histogram", "s", BUCKETS["taotrace.phase.duration"]),
    (LATEST_METRICS.schema_url, LATEST_METRICS.time_per_output_chunk, "histogram", "s", BUCKETS_SPEC_SECONDS),
    (LATEST_METRICS.schema_url, LATEST_METRICS.tokens, "counter", "{token}", ()),
]
ATTRIBUTE_SETS: list[dict[str, str | int | bool]] = [
    {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "server.port": 443},
    {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "server.port": 443, "error.type": "auth"},
    {"gen_ai.operation.name": "embeddings", "gen_ai.provider.name": "openai", "server.port": 8080},
    {"taotrace.api": "other", "flag": True},
    {},
]


def sdk_pipeline(temporality: AggregationTemporality) -> tuple[InMemoryMetricReader, dict[str, Any]]:
    reader = InMemoryMetricReader(preferred_temporality={SdkHistogram: temporality, SdkCounter: temporality})
    views = [
        View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(list(bounds)))
        for _, name, kind, _, bounds in INSTRUMENTS
        if kind == "histogram"
    ]
    provider = MeterProvider(
        [reader], resource=Resource(RESOURCE), views=views, exemplar_filter=AlwaysOffExemplarFilter()
    )
    instruments: dict[str, Any] = {}
    for schema, name, kind, unit, _ in INSTRUMENTS:
        meter = provider.get_meter("taotrace", "1.2.3", schema_url=schema)
        make = meter.create_histogram if kind == "histogram" else meter.create_counter
        instruments[name] = make(name, unit=unit, description=f"about {name}")
    return reader, instruments


def our_pipeline(temporality: AggregationTemporality) -> tuple[MetricPipeline, dict[str, Any]]:
    pipeline = MetricPipeline(Resource(RESOURCE), temporality=temporality)
    instruments: dict[str, Any] = {}
    for schema, name, kind, unit, bounds in INSTRUMENTS:
        meter = pipeline.get_meter("taotrace", "1.2.3", schema)
        if kind == "histogram":
            instruments[name] = meter.histogram(name, unit, f"about {name}", bounds)
        else:
            instruments[name] = meter.counter(name, unit, f"about {name}")
    return pipeline, instruments


def measurements(rng: random.Random, n: int) -> list[tuple[str, list[float], dict[str, str | int | bool]]]:
    """Values on and around the bounds, zeros, huge ones, and some the SDK refuses (negative, NaN, inf)."""
    out = []
    for _ in range(n):
        _, name, kind, _, bounds = rng.choice(INSTRUMENTS)
        attributes = rng.choice(ATTRIBUTE_SETS)
        if kind == "counter":
            values: list[float] = [rng.choice([0, 1, 7, 12000, -3]) for _ in range(rng.randrange(1, 4))]
        else:
            pool = [*bounds, 0.0, bounds[-1] * 10, float("nan"), float("inf"), -0.5]
            values = [
                rng.choice(pool) if rng.random() < 0.4 else rng.random() * bounds[-1] * rng.choice([0.001, 0.1, 1])
                for _ in range(rng.randrange(0, 40))
            ]
        out.append((name, values, attributes))
    return out


def decoded(body: bytes) -> tuple[ExportMetricsServiceRequest, list[float]]:
    """The request without timestamps, its scopes in schema URL and metric name order (an encoder
    before 1.31 sends no schema URL), its metrics in name order and each metric's points
    in attribute order (the SDK orders them by first measurement, ours by creation, and the points'
    order differs between SDK releases, e.g. 1.35's delta collections; OTLP gives it no meaning); and the
    histograms' sums apart (the SDK's cumulative sum adds up per-interval sums, ours adds value by
    value: the last bits may differ)."""
    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    sums: list[float] = []
    for rm in request.resource_metrics:
        scopes = sorted(rm.scope_metrics, key=lambda sm: (sm.schema_url, sorted(m.name for m in sm.metrics)))
        for sm in scopes:
            metrics = sorted(sm.metrics, key=lambda m: m.name)
            for m in metrics:
                data = getattr(m, m.WhichOneof("data"))
                points = sorted(data.data_points, key=lambda p: [kv.SerializeToString() for kv in p.attributes])
                data.ClearField("data_points")
                data.data_points.extend(points)
                for p in data.data_points:
                    p.start_time_unix_nano = p.time_unix_nano = 0
                    if m.HasField("histogram"):
                        sums.append(p.sum)
                        p.sum = -1.0
            sm.ClearField("metrics")
            sm.metrics.extend(metrics)
        rm.ClearField("scope_metrics")
        rm.scope_metrics.extend(scopes)
    return request, sums


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])
def test_the_same_request_as_the_sdk_s_own_aggregation(seed: int, temporality: AggregationTemporality) -> None:
    rng = random.Random(seed)
    reader, sdk = sdk_pipeline(temporality)
    pipeline, ours = our_pipeline(temporality)
    for _interval in range(3):  # several collections: delta starts afresh, cumulative keeps adding
        for name, values, attributes in measurements(rng, rng.randrange(0, 30)):
            # An SDK before 1.44 aggregates NaN and infinities: it gets only the values it would refuse today.
            for v in values if SDK_REFUSES_NON_FINITE else filter(math.isfinite, values):
                if isinstance(sdk[name], SdkHistogram):
                    sdk[name].record(v, attributes)
                else:
                    sdk[name].add(v, attributes)
            if hasattr(ours[name], "record_many"):
                ours[name].record_many(values, attributes)
            else:
                for v in values:
                    ours[name].add(v, attributes)
        data = reader.get_metrics_data()
        scopes = pipeline.collect()
        if data is None or not data.resource_metrics:
            assert scopes == []
            continue
        theirs, their_sums = decoded(library_encode(data).SerializeToString())
        mine = library_encode(MetricsData([ResourceMetrics(pipeline.resource, scopes, "")]))
        ours_request, our_sums = decoded(mine.SerializeToString())
        assert ours_request == theirs
        assert our_sums == pytest.approx(their_sums, rel=1e-12)


def test_timestamps_delta_from_the_previous_collection_cumulative_from_the_first_record() -> None:
    now = [1_000]
    for temporality in (AggregationTemporality.DELTA, AggregationTemporality.CUMULATIVE):
        now[0] = 1_000
        pipeline = MetricPipeline(temporality=temporality, clock=lambda: now[0])
        h = pipeline.get_meter("t", "1", "").histogram("h", "s", "", [1.0])
        now[0] = 2_000
        h.record(0.5, {"a": 1})
        now[0] = 3_000
        (first,) = pipeline.collect()[0].metrics[0].data.data_points
        now[0] = 4_000
        h.record(0.5, {"a": 1})
        now[0] = 5_000
        (second,) = pipeline.collect()[0].metrics[0].data.data_points
        times = (first.start_time_unix_nano, first.time_unix_nano, second.start_time_unix_nano, second.time_unix_nano)
        if temporality is AggregationTemporality.DELTA:
            assert times == (1_000, 3_000, 3_000, 5_000)
            assert second.count == 1
        else:
            assert times == (2_000, 3_000, 2_000, 5_000)
            assert second.count == 2
