"""Many values into an OpenTelemetry SDK histogram at once, with the SDK's own result.

`Histogram.record` costs ~5-10 us per value (attribute cleaning and hashing, a Measurement, the
consumer chain); a 1,000-chunk stream records 1,000 chunk gaps. `BulkRecorder.record` adds a batch to
the SDK's existing explicit-bucket aggregations for one attribute set directly: the same bucket
rule (`bisect_left`), sum, min and max the SDK's `aggregate` applies, under the same locks, in the
same order (view match, then aggregation) the SDK's `collect` takes them. It is used only where
the result is exactly the public path's: explicit-bucket histogram aggregations, views that keep
every attribute, and the always-off exemplar filter (so there are no exemplars to offer). Anything
else, or any SDK internals it does not find, takes `Histogram.record` per value.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any

from opentelemetry.metrics import Histogram

__all__ = ["BulkRecorder"]

try:  # SDK internals, checked at every use; without them everything takes the public path
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _hash_attributes
    from opentelemetry.sdk.metrics._internal.aggregation import _ExplicitBucketHistogramAggregation
except ImportError:  # pragma: no cover - another SDK layout
    _hash_attributes = None  # type: ignore[assignment]


def _matches(histogram: Any) -> list[Any] | None:
    """The histogram's view matches in every reader, when the direct path gives the SDK's result."""
    if _hash_attributes is None:
        return None
    consumer = getattr(histogram, "_measurement_consumer", None)
    config = getattr(consumer, "_sdk_config", None)
    if not isinstance(getattr(config, "exemplar_filter", None), AlwaysOffExemplarFilter):
        return None
    matches: list[Any] = []
    for storage in getattr(consumer, "_reader_storages", {}).values():
        found = getattr(storage, "_instrument_view_instrument_matches", {}).get(histogram)
        if not found:
            return None  # not set up yet: the first public record does it
        matches.extend(found)
    for match in matches:
        view = getattr(match, "_view", None)
        if getattr(view, "_attribute_keys", 0) is not None or not hasattr(match, "_attributes_aggregation"):
            return None
    return matches or None


def _add(matches: list[Any], key: object, values: Sequence[float]) -> bool:
    """Add `values` to each match's aggregation for `key`; False (and nothing changed) if one is missing."""
    with ExitStack() as stack:
        for match in matches:
            # The view match's lock first, as its collect() does: in delta mode collect swaps the
            # aggregations out under it, so the one updated here is the current one.
            stack.enter_context(match._lock)
        aggregations = [match._attributes_aggregation.get(key) for match in matches]
        if not all(type(a) is _ExplicitBucketHistogramAggregation for a in aggregations):
            return False
        total, low, high = sum(values), min(values), max(values)
        for agg in aggregations:
            bounds = agg._boundaries
            with agg._lock:
                if agg._value is None:
                    agg._value = agg._get_empty_bucket_counts()
                counts = agg._value
                for v in values:
                    counts[bisect_left(bounds, v)] += 1
                agg._sum += total
                if agg._record_min_max:
                    agg._min = min(agg._min, low)
                    agg._max = max(agg._max, high)
    return True


class BulkRecorder:
    """`record(histogram, values, attributes)`: `histogram.record(v, attributes)` for each value.

    Remembers, per histogram and attribute set, where the SDK keeps their aggregation (the view
    matches and the hashed attribute key; both fixed once created), so a record costs a dict
    lookup and the bucket updates. One per meter provider's users; not shared across providers.
    """

    def __init__(self) -> None:
        self._found: dict[tuple[Histogram, tuple[tuple[str, str | int], ...]], tuple[list[Any], object]] = {}

    def record(self, histogram: Histogram, values: Sequence[float], attributes: Mapping[str, str | int]) -> None:
        """Values must be what the proxy records (finite, non-negative); others take the public path."""
        if not values:
            return
        if min(values) < 0 or not math.isfinite(sum(values)):  # the SDK drops these, with a warning each
            for v in values:
                histogram.record(v, attributes)
            return
        cache_key = (histogram, tuple(attributes.items()))
        found = self._found.get(cache_key)
        if found is not None and _add(found[0], found[1], values):
            return
        histogram.record(values[0], attributes)  # creates the aggregation the SDK's way (incl. overflow)
        rest = values[1:]
        matches = _matches(histogram)
        if matches is not None:
            found = self._found[cache_key] = (matches, _hash_attributes(dict(attributes)))
            if not rest or _add(found[0], found[1], rest):
                return
        for v in rest:
            histogram.record(v, attributes)
