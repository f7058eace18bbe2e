"""The proxy's own overhead (`taotrace_proxy_overhead_seconds{stage}`) at rising load: the figures
behind the TaotraceProxyOverheadHigh threshold (docs/performance.md).

    python tests/bench/upstream.py --port 9100 &
    python -m proxy serve --upstream http://127.0.0.1:9100 --port 9101 --metrics-port 9102 &
    python tests/bench/overhead_levels.py --port 9101 --metrics-port 9102 --levels 1,32,128,256,512,1000

For each level, batches of C streams started together (tests/bench/load.py) for --seconds; the
histogram is scraped before and after, and p50 / p99 come from the bucket deltas, interpolated as
Prometheus' histogram_quantile does (a value past the top bucket reads as the top bound, 0.1 s).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import load
from payload import run

FAMILY = "taotrace_proxy_overhead_seconds"
Stage = dict[str, float]  # "le" bounds as text -> cumulative count, plus "sum" and "count"


def scrape(metrics_port: int) -> dict[str, Stage]:
    """The overhead histogram summed over APIs, per stage."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, Stage] = {}
    for family in text_string_to_metric_families(text):
        if family.name != FAMILY:
            continue
        for sample in family.samples:
            stage = out.setdefault(sample.labels["stage"], {})
            key = sample.labels["le"] if sample.name.endswith("_bucket") else sample.name.rsplit("_", 1)[1]
            stage[key] = stage.get(key, 0.0) + sample.value
    return out


def quantile(q: float, buckets: dict[float, float]) -> float:
    """histogram_quantile over cumulative bucket counts."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total == 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True, help="the proxy's port")
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--levels", default="1,32,128,256,512,1000", help="streams started together, per level")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    for level in (int(x) for x in args.levels.split(",")):
        before, started = scrape(args.metrics_port), time.monotonic()
        print(f"{level:5d} streams at a time: ", end="", flush=True)
        run(load(args.port, level, args.tokens, args.seconds))  # prints streams and client TTFT
        after, elapsed = scrape(args.metrics_port), time.monotonic() - started
        for name in ("request", "relay"):
            delta = {k: v - before.get(name, {}).get(k, 0.0) for k, v in after.get(name, {}).items()}
            buckets = {float(k): v for k, v in delta.items() if k not in ("sum", "count")}
            n = delta.get("count", 0.0)
            mean = delta.get("sum", 0.0) / n if n else math.nan
            print(
                f"      {name:7s} {n / elapsed:8.0f}/s  mean {mean * 1e3:7.3f} ms  "
                f"p50 {quantile(0.5, buckets) * 1e3:7.3f} ms  p99 {quantile(0.99, buckets) * 1e3:7.3f} ms"
            )


if __name__ == "__main__":
    main()
