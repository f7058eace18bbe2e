"""µs per request of each step the proxy runs once per request, at its end, in isolation.

    python tests/bench/finish_micro.py                              # this checkout
    python tests/bench/finish_micro.py --src /tmp/base --src .      # A/B: trees holding proxy/, interleaved

Each step runs on the input a 16-token chat stream through the bench upstream gives it (a
Bearer key, the upstream's six response headers, 16 token events, 19 reads, TCP_INFO through
uvloop's transport socket as the proxy reads it), plus `metrics.record` of a 256-token stream,
and the GenAI metrics' recording (on their worker thread, off the loop) of both streams into a
metric pipeline with no exporter (in a tree from before our own aggregation: an SDK meter provider
read by an in-memory reader);
best of `--best` runs of `--number` calls, and with several trees the best of `--rounds`
interleaved runs of each (a fresh process per run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import timeit
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any


def _transport_socket() -> Any:
    """What the proxy reads TCP_INFO from: a uvloop transport's socket (a PseudoSocket), connected."""
    import asyncio

    import uvloop

    loop = uvloop.new_event_loop()

    async def connect() -> Any:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(b"x" * 1000)
        await writer.drain()
        return server, writer  # kept alive with the loop

    _KEEP.append(loop.run_until_complete(connect()))
    return _KEEP[-1][1].transport.get_extra_info("socket")


_KEEP: list[Any] = []


def steps(src: Path) -> dict[str, Callable[[], Any]]:
    sys.path.insert(0, str(src))
    from multidict import CIMultiDict, CIMultiDictProxy
    from prometheus_client import CollectorRegistry

    from proxy.accounting.attribution import Attributor
    from proxy.accounting.ratelimits import read_rate_limits
    from proxy.dialects import Usage
    from proxy.exchange.record import RequestRecord
    from proxy.exchange.timing import PhaseClock
    from proxy.telemetry.genai_metrics import GenAIMetrics
    from proxy.telemetry.metrics import Metrics, ModelLabels
    from proxy.ui import LiveView
    from proxy.upstream import tcpinfo

    def clock(tokens: int = 16) -> PhaseClock:
        phase = PhaseClock(1.0)
        phase.sent(1.0005)
        phase.headers(1.001)
        phase.body_bytes(1.002)
        for k in range(tokens + 3):  # role chunk, tokens, usage chunk, [DONE]
            phase.relay.append(4e-6 + (k % 5) * 1e-6)
            phase.chunk(1.02 + k * 0.001)
            if 0 < k <= tokens:
                phase.token(1.02 + k * 0.001 + (k % 7) * 1e-4)
        return phase

    done = clock()
    timing = done.finish(1.04, 16, streaming=True)
    client = CIMultiDictProxy(
        CIMultiDict(
            {
                "Host": "127.0.0.1:8787",
                "User-Agent": "OpenAI/Python 1.99.0",
                "Accept": "application/json",
                "Content-Type": "application/json",
                "Authorization": "Bearer sk-" + "x" * 48,
                "Content-Length": "180",
            }
        )
    )
    upstream = [
        ("Content-Type", "text/event-stream"),
        ("Cache-Control", "no-cache"),
        ("Date", "Thu, 03 Dec 2026 12:00:00 GMT"),
        ("Server", "bench"),
        ("Transfer-Encoding", "chunked"),
        ("X-Request-Id", "req_0123456789abcdef"),
    ]
    limited = [*upstream, ("x-ratelimit-remaining-requests", "499"), ("x-ratelimit-reset-requests", "120ms")]
    attributor = Attributor((), body_user=False, salt=b"s" * 32)

    conn = _transport_socket()
    start = tcpinfo.read(conn)
    record = RequestRecord(
        trace_id="0" * 31 + "1", api="chat_completions", operation="chat", model="bench-model",
        response_model="bench-model", stream=True, method="POST", path="/v1/chat/completions",
        status_code=200, error_type="", timing=timing, usage=Usage(12, 16, None, None), usage_source="reported",
        finish_reasons=("stop",), response_id="chatcmpl-1", provider="openai",
        attributes=attributor(client, None),
        tcp=tcpinfo.request_stats(start, tcpinfo.read(conn), tcpinfo.read(conn)),
    )  # fmt: skip
    metrics = Metrics(CollectorRegistry())
    metrics.in_flight.labels("", "chat_completions")
    live = LiveView(1000)
    long = replace(record, timing=clock(256).finish(1.3, 256, streaming=True))
    provider: Any
    try:  # as build_meter_provider makes it, with no exporter
        from proxy.telemetry.metric_pipeline import MetricPipeline

        provider = MetricPipeline()
    except ImportError:  # an older tree: the SDK's, with an in-memory reader in place of the exporter
        from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        from proxy.telemetry.genai_metrics import views  # type: ignore[attr-defined]

        provider = MeterProvider([InMemoryMetricReader()], views=views(), exemplar_filter=AlwaysOffExemplarFilter())
    genai = GenAIMetrics(provider, server_address="127.0.0.1", server_port=8788, models=ModelLabels())
    genai.stop()  # its worker ends; drain() below records on this thread, as the worker would
    sdk_record = _sdk_instruments()

    def genai_record(rec: RequestRecord) -> None:
        genai(rec)
        genai.drain()

    return {
        "timing.finish": lambda: done.finish(1.04, 16, streaming=True),
        "attribution (key id)": lambda: attributor(client, None),
        "rate limits (none sent)": lambda: read_rate_limits(upstream, 1e9),
        "rate limits (OpenAI's two)": lambda: read_rate_limits(limited, 1e9),
        "tcpinfo.read + request_stats": lambda: tcpinfo.request_stats(start, tcpinfo.read(conn), tcpinfo.read(conn)),
        "metrics.record": lambda: metrics.record(record),
        "in-flight gauge labels()": lambda: metrics.in_flight.labels("", "chat_completions"),
        "metrics.record, 256 tokens": lambda: metrics.record(long),
        "live view observe": lambda: live.observe(record),
        "GenAI metrics (worker)": lambda: genai_record(record),
        "GenAI metrics, 256 tokens": lambda: genai_record(long),
        "GenAI metrics, SDK instruments": lambda: sdk_record(record),
        "SDK instruments, 256 tokens": lambda: sdk_record(long),
    }


def _sdk_instruments() -> Callable[[Any], None]:
    """The other way to record a request's GenAI metrics: the OpenTelemetry SDK's own
    instruments (a MeterProvider with the same buckets as views, no exemplars, an in-memory
    reader), one call per value as its API takes them; attribute dicts made once, as ours are."""
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    from proxy.telemetry.genai_metrics import BUCKETS

    views = [
        View(instrument_name=n, aggregation=ExplicitBucketHistogramAggregation(list(b))) for n, b in BUCKETS.items()
    ]
    provider = MeterProvider([InMemoryMetricReader()], views=views, exemplar_filter=AlwaysOffExemplarFilter())
    meter = provider.get_meter("taotrace", "0", "https://opentelemetry.io/schemas/gen-ai/0.1.0")
    duration, tokens, ttfc, tpoc, ttft, phase, overhead = (
        meter.create_histogram(name)
        for name in (
            "gen_ai.client.operation.duration", "gen_ai.client.token.usage",
            "gen_ai.client.operation.time_to_first_chunk", "gen_ai.client.operation.time_per_output_chunk",
            "taotrace.time_to_first_token", "taotrace.phase.duration", "taotrace.proxy.overhead",
        )
    )  # fmt: skip
    base = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "bench-model",
            "gen_ai.response.model": "bench-model", "server.address": "127.0.0.1", "server.port": 8788}  # fmt: skip
    ours = {**base, "taotrace.api": "chat_completions"}
    inputs, outputs = ({**base, "gen_ai.token.type": t} for t in ("input", "output"))
    network, prefill, decode = ({**ours, "taotrace.phase": p} for p in ("network", "prefill_wait", "decode"))
    request, relay = ({"taotrace.api": "chat_completions", "taotrace.stage": s} for s in ("request", "relay"))

    def record(rec: Any) -> None:
        t = rec.timing
        for v in t.relay:
            overhead.record(v, relay)
        overhead.record(t.overhead_request, request)
        duration.record(t.duration, base)
        tokens.record(rec.usage.input_tokens, inputs)
        tokens.record(rec.usage.output_tokens, outputs)
        ttfc.record(t.ttfc, base)
        for v in t.chunk_gaps:
            tpoc.record(v, base)
        phase.record(t.network, network)
        ttft.record(t.ttft, ours)
        phase.record(t.prefill_wait, prefill)
        phase.record(t.decode, decode)

    return record


def _run_one(src: Path, number: int, best: int) -> dict[str, float]:
    return {name: min(timeit.repeat(fn, number=number, repeat=best)) / number * 1e6 for name, fn in steps(src).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--src", type=Path, action="append", help="a tree holding proxy/ (repeat for A/B; default: this one)"
    )
    ap.add_argument("--rounds", type=int, default=3, help="A/B: runs of each tree, interleaved; the best is kept")
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--best", type=int, default=5)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one tree, one run (a child)
    args = ap.parse_args()
    srcs = [p.resolve() for p in (args.src or [Path(__file__).resolve().parents[2]])]
    if args.json:
        print(json.dumps(_run_one(srcs[0], args.number, args.best)))
        return
    best: dict[Path, dict[str, float]] = {}
    for _ in range(args.rounds):
        for src in srcs:  # a fresh process per tree: both import `proxy`
            argv = [sys.executable, __file__, "--json", "--src", str(src), "--number", str(args.number)]
            got = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
            mine = best.setdefault(src, got)
            for name, us in got.items():
                mine[name] = min(mine[name], us)
    names = list(best[srcs[0]])
    print(f"{'us per request (best)':32s}" + "".join(f"{str(src)[-18:]:>20s}" for src in srcs))
    for name in names:
        print(f"{name:32s}" + "".join(f"{best[src].get(name, float('nan')):20.2f}" for src in srcs))
    print(
        f"{'sum (16-token stream, no limits)':32s}"
        + "".join(
            f"{sum(v for k, v in best[src].items() if 'OpenAI' not in k and '256' not in k and 'GenAI' not in k and 'SDK' not in k):20.2f}"
            for src in srcs
        )
    )


if __name__ == "__main__":
    main()
