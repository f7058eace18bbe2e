"""CPU per request of Telemetry.start + inject + finish: the root span built directly vs through
the SDK's public Tracer.start_span (the phase children are built directly in both).

    .venv/bin/python tests/bench/spans_micro.py [requests per trial, default 5000]

Batch processor with an exporter that drops; process CPU time (all threads), 7 trials each.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from multidict import CIMultiDict
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from proxy.telemetry.spans import Telemetry
from tests.test_telemetry_fast import INFO, T0, carrier, streamed


class Drop(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def trial(sdk_root: bool, n: int, finish: bool) -> float:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=100_000, max_export_batch_size=512))
    tel = Telemetry(provider, upstream_host="api.example", upstream_port=443, upstream_base="https://api.example")
    if sdk_root:
        tel._root_ok = False
    rec, src = streamed(), carrier()
    for i in range(500 + n):
        if i == 500:
            t = time.process_time()
        span = tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)
        tel.inject(span, CIMultiDict(src))
        if finish:
            tel.finish(span, rec)
    provider.force_flush()
    dt = time.process_time() - t
    provider.shutdown()
    return dt / n * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    for finish, what in ((True, "start + inject + finish"), (False, "start + inject")):
        for sdk_root, arm in ((False, "root built directly"), (True, "root through the SDK")):
            xs = [trial(sdk_root, n, finish) for _ in range(7)]
            print(
                f"{what:24} {arm:22} median {statistics.median(xs):6.1f} us/request (min {min(xs):.1f}, max {max(xs):.1f})"
            )


if __name__ == "__main__":
    main()
