"""µs per request of each step the proxy runs once per request, at its end, in isolation.

    python tests/bench/finish_micro.py                 # this checkout
    python tests/bench/finish_micro.py --src /tmp/base # another tree holding proxy/ (A/B)

Each step runs on the input a 16-token chat stream through the bench upstream gives it (a
Bearer key, the upstream's six response headers, 16 token events, 19 reads); best of `--best`
runs of `--number` calls. Steps that exist only in a newer tree are skipped in an older one.
"""

from __future__ import annotations

import argparse
import socket
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any


def steps(src: Path) -> dict[str, Callable[[], Any]]:
    sys.path.insert(0, str(src))
    from multidict import CIMultiDict, CIMultiDictProxy
    from prometheus_client import CollectorRegistry

    from proxy import tcpinfo
    from proxy.accounting.attribution import Attributor
    from proxy.accounting.ratelimits import read_rate_limits
    from proxy.dialects import Usage
    from proxy.telemetry.metrics import Metrics
    from proxy.timing import PhaseClock, RequestRecord
    from proxy.ui import LiveView

    def clock() -> PhaseClock:
        phase = PhaseClock(1.0)
        phase.sent(1.0005)
        phase.headers(1.001)
        phase.body_bytes(1.002)
        for k in range(19):
            phase.relay.append(4e-6)
            phase.chunk(1.02 + k * 0.001)
            if 0 < k < 17:
                phase.token(1.02 + k * 0.001)
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

    listener = socket.create_server(("127.0.0.1", 0))
    conn = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    peer.sendall(b"x" * 1000)
    conn.recv(1000)
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
    live = LiveView(1000)
    return {
        "timing.finish": lambda: done.finish(1.04, 16, streaming=True),
        "attribution (key id)": lambda: attributor(client, None),
        "rate limits (none sent)": lambda: read_rate_limits(upstream, 1e9),
        "rate limits (OpenAI's two)": lambda: read_rate_limits(limited, 1e9),
        "tcpinfo.read + request_stats": lambda: tcpinfo.request_stats(start, tcpinfo.read(conn), tcpinfo.read(conn)),
        "metrics.record": lambda: metrics.record(record),
        "live view observe": lambda: live.observe(record),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[2])
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--best", type=int, default=5)
    args = ap.parse_args()
    total = 0.0
    for name, fn in steps(args.src.resolve()).items():
        us = min(timeit.repeat(fn, number=args.number, repeat=args.best)) / args.number * 1e6
        if "OpenAI" not in name:
            total += us
        print(f"{name:32s} {us:6.2f} us")
    print(f"{'sum (without OpenAI limits)':32s} {total:6.2f} us")


if __name__ == "__main__":
    main()
