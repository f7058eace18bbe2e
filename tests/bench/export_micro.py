"""The span export thread's CPU per request: `OtlpSpanExporter.export` (encode, GIL pauses, HTTP
delivery) of encode_micro's 512-span batches (128 requests each) to a live `otlp_sink.py`.

    .venv/bin/python tests/bench/export_micro.py [batches per trial, default 20]

Run it from each tree for a before/after (it measures the `proxy/` beside it); run the trees in
turns, since a busy host moves these numbers. Thread CPU time, 7 trials; the encoding alone is
timed in the same trials. For instructions instead, run it under `valgrind --tool=callgrind`
with two batch counts and divide the difference.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from encode_micro import request  # puts this tree's root first on sys.path: the proxy measured is this one
from procs import free_port, wait_port

from proxy.telemetry import otlp, otlp_env
from proxy.telemetry.span_exporter import OtlpSpanExporter

HERE = Path(__file__).resolve().parent


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    port = free_port()
    sink = subprocess.Popen(
        [sys.executable, str(HERE / "otlp_sink.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, 30, sink)
        settings = otlp_env.export_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}, "traces")
        assert settings is not None
        exporter = OtlpSpanExporter(settings)
        batches = [[s for r in range(128) for s in request(b * 128 + r, False)] for b in range(n)]
        assert exporter.export(batches[0])  # connect, warm the caches
        exports, encodes = [], []
        for _ in range(7):
            t = time.thread_time()
            for batch in batches:
                assert exporter.export(batch)
            exports.append((time.thread_time() - t) / (n * 128) * 1e6)
            t = time.thread_time()
            for batch in batches:
                otlp.encode_spans(batch)
            encodes.append((time.thread_time() - t) / (n * 512) * 1e6)
        exporter.shutdown()
        print(
            f"export {min(exports):.1f} us/request (median {statistics.median(exports):.1f}); "
            f"encoding alone {min(encodes):.2f} us/span (median {statistics.median(encodes):.2f})"
        )
    finally:
        sink.terminate()
        sink.wait(10)


if __name__ == "__main__":
    main()
