"""CPU of one request's spans (start + inject + finish, 16-token stream, batch processor), with
the hand-built root span (`sdk_internals.direct_root`), with the root through the SDK's
`Tracer.start_span` (children still direct), and with everything through the SDK.

    .venv/bin/python tests/bench/root_span.py

The hand-built root is kept only while this shows it pays (docs/performance.md).
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.test_telemetry_fast import carrier, make, run, streamed

REC = streamed(tokens=16)
SRC = carrier(traceparent=True)


def bench(root_direct: bool, fast: bool = True, n: int = 20000) -> float:
    """Best of five: µs of process CPU (all threads, so the exporter's share too) per request."""
    provider, _, tel = make(None, "batch", fast)
    if not root_direct:
        tel._root_ok = False
    for _ in range(2000):
        run(tel, REC, SRC)
    best = float("inf")
    for _ in range(5):
        gc.collect()
        t = time.process_time()
        for _ in range(n):
            run(tel, REC, SRC)
        best = min(best, (time.process_time() - t) / n)
    provider.shutdown()
    return best * 1e6


if __name__ == "__main__":
    print(
        f"root direct {bench(True):.1f} us; root via the SDK (children direct) {bench(False):.1f} us; "
        f"everything via the SDK {bench(True, fast=False):.1f} us"
    )
