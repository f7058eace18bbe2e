"""Which of a record's per-token series a worker bins before it ships the record, and into which
buckets: those of the histograms the supervisor adds each series to (`proxy/exchange/series.py`).

    itl          taotrace_inter_token_latency_seconds                  BUCKETS_TOKEN
    relay        taotrace_proxy_overhead_seconds{stage="relay"} and
                 the OTLP taotrace.proxy.overhead{taotrace.stage=relay}  BUCKETS_OVERHEAD
    chunk_gaps   gen_ai.client.operation.time_per_output_chunk          BUCKETS_SPEC_SECONDS

A histogram given a series binned for other buckets raises rather than miscount (a test keeps
this table and the histograms' buckets the same).
"""

from __future__ import annotations

from typing import Any

from proxy.exchange.record import RequestRecord
from proxy.exchange.series import bin_series
from proxy.exchange.timing import RequestTiming
from proxy.telemetry.genai_metrics import BUCKETS_SPEC_SECONDS
from proxy.telemetry.metrics import BUCKETS_OVERHEAD, BUCKETS_TOKEN
from proxy.workers.messages import record_form
from proxy.workers.plain import Plain, copy_with

__all__ = ["BIN_FROM", "EDGES", "binned"]

EDGES: dict[str, tuple[float, ...]] = {
    "itl": BUCKETS_TOKEN,
    "relay": BUCKETS_OVERHEAD,
    "chunk_gaps": BUCKETS_SPEC_SECONDS,
}
# Shorter series cross as they are: sorting a few floats costs the supervisor less than a
# Binned's own object (tests/bench/supervisor_records.py --micro).
BIN_FROM = 32

_timing_form: Plain[RequestTiming] = Plain(RequestTiming)


def binned(rec: RequestRecord) -> RequestRecord:
    """`rec` with each series of `BIN_FROM` values or more binned (itl with the live view's bars);
    `rec` itself when none is that long."""
    t = rec.timing
    changes: dict[str, Any] = {}
    for name, edges in EDGES.items():
        values = getattr(t, name)
        if isinstance(values, tuple) and len(values) >= BIN_FROM:
            found = bin_series(values, edges, keep=name == "itl")
            if found is not None:
                changes[name] = found
    if not changes:
        return rec
    return copy_with(record_form, rec, timing=copy_with(_timing_form, t, **changes))
