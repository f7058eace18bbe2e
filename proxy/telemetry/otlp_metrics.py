"""Collected metrics as an OTLP `ExportMetricsServiceRequest`: protobuf bytes, or OTLP/JSON (pure).

One resource; one scope per `ScopeData` (a convention version: its own schema URL); each metric
with its name, description and unit, as a Histogram (explicit bounds, bucket counts, count, sum,
min, max) or a monotonic Sum, with its aggregation temporality. Protobuf bytes are written
directly, as `otlp.py` does for spans. The JSON form is the OTLP/JSON encoding (the protobuf JSON
mapping: lowerCamelCase names, 64-bit integers as strings, enums as numbers), one object per
export, which a collector's OTLP JSON file receiver reads back.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxy.telemetry.aggregate import HistogramPoint, MetricData, ScopeData, SumPoint
from proxy.telemetry.otlp import _attributes, _len, _message, _string

__all__ = ["encode_metrics", "json_metrics"]

PAUSE_EVERY = 64  # data points encoded before `pause` is called (see otlp.PAUSE_EVERY)
_pack_d = struct.Struct("<d").pack
_pack_q = struct.Struct("<Q").pack
_pack_sq = struct.Struct("<q").pack


def _histogram_point(p: HistogramPoint, bounds: bytes) -> bytes:
    counts = b"".join([_pack_q(c) for c in p.counts])
    return b"".join(
        (
            _attributes(p.attributes, b"\x4a"),  # 9
            b"\x11",  # 2 start_time_unix_nano, fixed64
            _pack_q(p.start_ns),
            b"\x19",  # 3 time_unix_nano
            _pack_q(p.time_ns),
            b"\x21",  # 4 count, fixed64
            _pack_q(p.count),
            b"\x29",  # 5 sum, double
            _pack_d(p.sum),
            b"\x32",  # 6 bucket_counts, packed fixed64
            _len(len(counts)),
            counts,
            bounds,  # 7 explicit_bounds, packed double
            b"\x59",  # 11 min
            _pack_d(p.min),
            b"\x61",  # 12 max
            _pack_d(p.max),
        )
    )


def _sum_point(p: SumPoint) -> bytes:
    value = (
        b"\x31" + _pack_sq(p.value) if type(p.value) is int else b"\x21" + _pack_d(p.value)
    )  # 6 as_int | 4 as_double
    return _attributes(p.attributes, b"\x3a") + b"\x11" + _pack_q(p.start_ns) + b"\x19" + _pack_q(p.time_ns) + value


def _metric(m: MetricData, pause: Callable[[], object] | None, done: list[int]) -> bytes:
    points = []
    bounds = b""
    if m.histogram and m.bounds:
        packed = b"".join([_pack_d(b) for b in m.bounds])
        bounds = b"\x3a" + _len(len(packed)) + packed
    for p in m.points:
        if isinstance(p, HistogramPoint):
            points.append(_message(b"\x0a", _histogram_point(p, bounds)))
        else:
            points.append(_message(b"\x0a", _sum_point(p)))
        done[0] += 1
        if pause is not None and done[0] % PAUSE_EVERY == 0:
            pause()
    data = b"".join(points) + b"\x10" + bytes((int(m.temporality),))
    if m.histogram:
        data = _message(b"\x4a", data)  # Metric.histogram = 9
    else:
        data = _message(b"\x3a", data + b"\x18\x01")  # Metric.sum = 7, is_monotonic
    return _string(b"\x0a", m.name) + _string(b"\x12", m.description) + _string(b"\x1a", m.unit) + data


def encode_metrics(
    resource: Mapping[str, Any], scopes: Sequence[ScopeData], pause: Callable[[], object] | None = None
) -> bytes:
    """The serialised ExportMetricsServiceRequest; `pause` is called every PAUSE_EVERY points."""
    done = [0]
    body = [_message(b"\x0a", _attributes(resource, b"\x0a"))]  # ResourceMetrics.resource
    for scope in scopes:
        head = _message(b"\x0a", _string(b"\x0a", scope.name) + _string(b"\x12", scope.version))
        metrics = b"".join([_message(b"\x12", _metric(m, pause, done)) for m in scope.metrics])
        body.append(_message(b"\x12", head + metrics + _string(b"\x1a", scope.schema_url)))
    return _message(b"\x0a", b"".join(body))  # ExportMetricsServiceRequest.resource_metrics


def _json_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _json_attributes(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _json_value(v)} for k, v in attributes.items()]


def _json_point(p: HistogramPoint | SumPoint, bounds: tuple[float, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "attributes": _json_attributes(p.attributes),
        "startTimeUnixNano": str(p.start_ns),
        "timeUnixNano": str(p.time_ns),
    }
    if isinstance(p, HistogramPoint):
        out.update(
            count=str(p.count),
            sum=p.sum,
            bucketCounts=[str(c) for c in p.counts],
            explicitBounds=list(bounds),
            min=p.min,
            max=p.max,
        )
    elif type(p.value) is int:
        out["asInt"] = str(p.value)
    else:
        out["asDouble"] = p.value
    return out


def _json_metric(m: MetricData) -> dict[str, Any]:
    data: dict[str, Any] = {
        "dataPoints": [_json_point(p, m.bounds) for p in m.points],
        "aggregationTemporality": int(m.temporality),
    }
    if not m.histogram:
        data["isMonotonic"] = True
    return {"name": m.name, "description": m.description, "unit": m.unit, ("histogram" if m.histogram else "sum"): data}


def json_metrics(resource: Mapping[str, Any], scopes: Sequence[ScopeData]) -> dict[str, Any]:
    """The same request in OTLP/JSON (json.dumps it; NaN never occurs: the aggregation rejects it)."""
    return {
        "resourceMetrics": [
            {
                "resource": {"attributes": _json_attributes(resource)},
                "scopeMetrics": [
                    {
                        "scope": {"name": s.name, "version": s.version},
                        "metrics": [_json_metric(m) for m in s.metrics],
                        "schemaUrl": s.schema_url,
                    }
                    for s in scopes
                ],
            }
        ]
    }
