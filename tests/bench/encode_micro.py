"""CPU per span of otlp.encode_spans on batches shaped like the proxy's (a CLIENT root with ~20
attributes and its three INTERNAL phase children), as SpanData.

    .venv/bin/python tests/bench/encode_micro.py [batches per trial, default 200] [path/to/otlp.py]

A second argument loads another copy of otlp.py (e.g. an older one, for a before/after). 512-span
batches (128 requests), token counts and ids varying; process CPU time, 7 trials.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from proxy.telemetry import otlp
from proxy.telemetry.spandata import Resource, Scope, SpanData

RESOURCE = Resource({"service.name": "taotrace", "service.version": "0.9.0", "telemetry.sdk.language": "python"})
SCOPE = Scope("taotrace", "0.9.0", "https://opentelemetry.io/schemas/1.37.0")
T0 = 1_700_000_000_000_000_000


def request(i: int, links: bool) -> list[SpanData]:
    trace_id = (0x4BF92F3577B34DA6A3CE929D0E0E4736 + i) & ((1 << 128) - 1)
    root_ctx = SpanContext(trace_id, 0x1000 + 4 * i, False, TraceFlags(1), TraceState([("ot", "th:8")]))
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
        "gen_ai.request.stream": True,
        "gen_ai.usage.input_tokens": 100 + i % 50,
        "gen_ai.usage.output_tokens": 200 + i % 300,
        "gen_ai.usage.cache_read.input_tokens": 0,
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.response.id": f"chatcmpl-{i:012d}",
        "gen_ai.response.time_to_first_chunk": 0.2 + i % 17 / 100,
        "server.address": "api.example",
        "server.port": 443,
        "http.request.method": "POST",
        "http.response.status_code": 200,
        "url.path": "/v1/chat/completions",
        "taotrace.key.id": "k_3f2a9c",
        "taotrace.cost": 0.000123 * (i % 9),
        "taotrace.token_events": 200 + i % 300,
        "taotrace.sampling.reason": "ratio",
    }
    root = SpanData(
        "chat gpt-4o-mini", root_ctx, SpanContext(trace_id, 0xFEED, True, TraceFlags(1)), SpanKind.CLIENT,
        T0 + i, T0 + i + 2_000_000_000, attributes, RESOURCE, SCOPE, Status(StatusCode.OK),
        (Link(SpanContext(trace_id ^ 1, 7, True, TraceFlags(1)), {"taotrace.link": "retry"}),) if links else (),
    )  # fmt: skip
    children = [
        SpanData(
            name,
            SpanContext(trace_id, 0x1001 + 4 * i + k, False, TraceFlags(1)),
            root_ctx,
            SpanKind.INTERNAL,
            T0 + i + k,
            T0 + i + k + 1000,
            {"taotrace.token_events": 200 + i % 300} if name == "decode" else {},
            RESOURCE,
            SCOPE,
        )  # fmt: skip
        for k, name in enumerate(("network", "prefill_wait", "decode"))
    ]
    return [root, *children]


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("otlp_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trial(module: ModuleType, batches: list[list[SpanData]]) -> float:
    t = time.process_time()
    for batch in batches:
        module.encode_spans(batch)
    return (time.process_time() - t) / sum(map(len, batches)) * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    module = load(sys.argv[2]) if len(sys.argv) > 2 else otlp
    for links in (False, True):
        if links and module is not otlp:
            break  # an older encoder handed links to the library
        batches = [[s for r in range(128) for s in request(b * 128 + r, links)] for b in range(n)]
        module.encode_spans(batches[0])  # warm the caches
        xs = [trial(module, batches) for _ in range(7)]
        what = "with a link on each root" if links else "no links"
        print(f"{what:26} median {statistics.median(xs):5.2f} us/span (min {min(xs):.2f}, max {max(xs):.2f})")


if __name__ == "__main__":
    main()
