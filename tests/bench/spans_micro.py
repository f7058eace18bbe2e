"""CPU per request of `Spans.start` + inject + finish, spans handed to the batch processor.

    .venv/bin/python tests/bench/spans_micro.py [requests per trial, default 5000]

The batch processor with an exporter that drops (encoding is measured by encode_micro.py);
process CPU time (all threads), 7 trials each: the built-in default sampler, and a sampler
plug-in called through the OpenTelemetry SDK's public API.
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
from opentelemetry.sdk.trace.sampling import DEFAULT_ON

from proxy.telemetry.batch_processor import BatchSpanProcessor
from proxy.telemetry.sampler import DEFAULT, Sampler, SdkSampler
from proxy.telemetry.spans import Spans
from proxy.telemetry.tracing import Tracing
from tests.test_span_equivalence import INFO, T0, carrier, streamed


class Drop:
    def export(self, spans: Sequence[Any]) -> bool:
        return True

    def shutdown(self) -> None:
        pass


def trial(sampler: Sampler, n: int, finish: bool) -> float:
    processor = BatchSpanProcessor(Drop(), max_queue_size=100_000, max_export_batch_size=512)
    tel = Spans(
        Tracing(processor=processor, sampler=sampler),
        upstream_host="api.example", upstream_port=443, upstream_base="https://api.example",
    )  # fmt: skip
    rec, src = streamed(), carrier()
    for i in range(500 + n):
        if i == 500:
            t = time.process_time()
        span = tel.start(INFO, "POST", "/v1/chat/completions", "", src, T0)
        tel.inject(span, CIMultiDict(src))
        if finish:
            tel.finish(span, rec)
    processor.force_flush(30.0)
    dt = time.process_time() - t
    processor.shutdown(5.0)
    return dt / n * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    for finish, what in ((True, "start + inject + finish"), (False, "start + inject")):
        for sampler, arm in ((DEFAULT, "built-in sampler"), (SdkSampler(DEFAULT_ON), "SDK sampler plug-in")):
            xs = [trial(sampler, n, finish) for _ in range(7)]
            print(
                f"{what:24} {arm:22} median {statistics.median(xs):6.1f} us/request (min {min(xs):.1f}, max {max(xs):.1f})"
            )


if __name__ == "__main__":
    main()
