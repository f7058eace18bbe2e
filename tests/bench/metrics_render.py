"""How long a /metrics render takes at the model cap: ours against prometheus_client's.

    .venv/bin/python tests/bench/metrics_render.py [--models 100] [--compare]

Every api x (models + `other`) pair gets streamed requests of two outcomes, so every label child
exists (~110k lines, ~11 MB). "cold" renders after every child changed (the worst case: each one
re-rendered); "unchanged" renders with nothing new (per-child pages come from the cache).
`--compare` also renders the same observations with prometheus_client (the code before
issue 15), which takes seconds.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from proxy.telemetry.exposition import Histogram
from proxy.telemetry.metrics import Metrics, ModelLabels
from tests.fakes import record_for

NL = b"\n"
APIS = ("chat_completions", "completions", "responses", "messages", "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--compare", action="store_true", help="also time prometheus_client on the same observations")
    args = parser.parse_args()
    rnd = random.Random(1)
    metrics = Metrics(None, ModelLabels(limit=args.models))
    records = [
        record_for(api, f"model-{k}", status, rnd)
        for api in APIS
        for k in range(args.models + 1)
        for status in (200, 429)
    ]
    for rec in records:
        metrics.record(rec)
    histograms = [f for f in metrics.registry.families if isinstance(f, Histogram)]

    def touch() -> None:  # as if every child saw a request since the last scrape
        for family in histograms:
            for child in family.children.values():
                child.version += 1

    for openmetrics in (False, True):
        cold, warm = [], []
        for _ in range(args.rounds):
            touch()
            t = time.perf_counter()
            page = metrics.registry.render(openmetrics)
            cold.append(time.perf_counter() - t)
            t = time.perf_counter()
            metrics.registry.render(openmetrics)
            warm.append(time.perf_counter() - t)
        name = "OpenMetrics" if openmetrics else "text 0.0.4"
        print(
            f"{name:12} {len(page) / 1e6:.1f} MB {page.count(NL)} lines: cold median {statistics.median(cold) * 1e3:.1f} ms"
            f" (min {min(cold) * 1e3:.1f}), unchanged median {statistics.median(warm) * 1e3:.1f} ms"
        )
    if args.compare:
        compare(records)


def compare(records: list[object]) -> None:
    """The same records through prometheus_client's Histogram/Counter and its encoders."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

    from proxy.telemetry.metrics import BUCKETS_LATENCY, BUCKETS_TOKEN

    disable_created_metrics()
    reg = CollectorRegistry()
    am = ("api", "model")
    hists = {
        n: Histogram(n, n, am + (("phase",) if n == "p" else ()), buckets=b, registry=reg)
        for n, b in (
            ("d", BUCKETS_LATENCY),
            ("t", BUCKETS_LATENCY),
            ("o", BUCKETS_TOKEN),
            ("i", BUCKETS_TOKEN),
            ("p", BUCKETS_LATENCY),
        )
    }
    req = Counter("r", "r", (*am, "status_code", "error_type"), registry=reg)
    tok = Counter("k", "k", (*am, "type"), registry=reg)
    for rec in records:
        r = rec  # type: ignore[assignment]
        t, ex = r.timing, {"trace_id": r.trace_id}  # type: ignore[attr-defined]
        labels = (r.api, r.model)  # type: ignore[attr-defined]
        req.labels(*labels, str(r.status_code), r.error_type).inc()  # type: ignore[attr-defined]
        hists["d"].labels(*labels).observe(t.duration, ex)
        hists["t"].labels(*labels).observe(t.ttft, ex)
        hists["o"].labels(*labels).observe(t.tpot, ex)
        for gap in t.itl:
            hists["i"].labels(*labels).observe(gap)
        for phase, v in (("network", t.network), ("prefill_wait", t.prefill_wait), ("decode", t.decode)):
            hists["p"].labels(*labels, phase).observe(v, ex)
        for kind in ("input", "output", "cached_input", "reasoning"):
            tok.labels(*labels, kind).inc()
    for name, encode in (("text 0.0.4", generate_latest), ("OpenMetrics", openmetrics_latest)):
        t0 = time.perf_counter()
        page = encode(reg)
        print(f"prometheus_client {name}: {(time.perf_counter() - t0) * 1e3:.0f} ms, {len(page) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
