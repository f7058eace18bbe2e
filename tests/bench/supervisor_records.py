"""Records per second a `--workers` supervisor takes in, and its CPU per record.

    python tests/bench/supervisor_records.py                             # 8 workers x 2,500 records/s offered
    python tests/bench/supervisor_records.py --workers 2 --rate 0         # 2 workers, as fast as it reads
    python tests/bench/supervisor_records.py --spans otlp --genai         # every sink the group can have
    python tests/bench/supervisor_records.py --profile /tmp/sup.prof      # cProfile of the supervisor's loop
    python tests/bench/supervisor_records.py --micro --ab /tmp/base       # each step alone, two trees

The real supervisor (`supervising`, in this process, on uvloop) runs N workers that are this
script with `--worker`: each speaks the real channel (Hello, Start, Ready) and hands records to
the real `Shipper`, which batches and encodes them as a serving worker does. The records are
built the way a worker builds them: a chat stream's `PhaseClock` (chunk gaps, inter-token
latencies, relay times), usage, attribution attributes (a salted key id, a header attribute),
TCP stats and, when spans leave the supervisor, the root span's start from the real
`Spans.start` / `conclude` in ship mode. Half the records are 16-token streams, half
`--long` tokens (default 256).

A worker offers `--rate` records/s (0: as many as it can) and keeps at most `--window` bytes
unread in its socket (it waits, it never drops), so a supervisor that falls behind shows as
fewer records/s. Timing starts at the `--warmup`-th record the
supervisor hands its sinks and ends at the last: records/s is wall time, CPU is this process's
(`time.process_time`: every thread, the span exporter's included), which on a 2-core machine
shared with the workers is the number to compare (`records/s if it had a core` = 1e6 / µs).
`--pin`: the supervisor on CPU 1, the workers on CPU 0.

Sinks: the `taotrace_*` metrics and the live view always; `--spans`: `off` (no exporter: no span
starts shipped), `discard` (a batch processor with an exporter that drops them: replay and the
queue, no encoding), `otlp` (OTLP/HTTP to `otlp_sink.py` on a free port); `--genai`: the OTLP
GenAI metrics, exported to the same sink every `OTEL_METRIC_EXPORT_INTERVAL`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _src(argv: Sequence[str]) -> Path:
    """`--src DIR`: the tree whose `proxy/` runs (an A/B: `git worktree add /tmp/base main`)."""
    return Path(argv[argv.index("--src") + 1]).resolve() if "--src" in argv else HERE.parents[1]


sys.path.insert(0, str(_src(sys.argv)))


def records(count: int, long: int, spans: bool, seed: int = 1) -> list[Any]:
    """`count` records as a serving worker builds them: 16-token and `long`-token chat streams."""
    from multidict import CIMultiDict

    from proxy.accounting.attribution import Attributor, HeaderAttribute
    from proxy.config.settings import Settings
    from proxy.dialects import Usage
    from proxy.dialects.dialect import RequestInfo
    from proxy.exchange.record import RequestRecord
    from proxy.exchange.timing import PhaseClock
    from proxy.reporting.reporting import spans_for
    from proxy.telemetry.tracing import build_tracing
    from proxy.upstream.tcpinfo import TcpStats

    rnd = random.Random(seed)
    telemetry = spans_for(Settings(), build_tracing({}, export=False), ship=True)
    attributor = Attributor((HeaderAttribute(header="X-Team", attribute="app.team"),), body_user=False, salt=b"s" * 32)
    headers = CIMultiDict({"Authorization": "Bearer sk-" + "x" * 48, "X-Team": "search"})
    info = RequestInfo(
        "chat_completions", "chat", "openai", "gpt-4o-mini", True,
        params=(("gen_ai.request.max_tokens", 512), ("gen_ai.request.temperature", 0.7)),
    )  # fmt: skip
    out = []
    for i in range(count):
        tokens = 16 if i % 2 == 0 else long
        t0 = 1000.0 + i
        clock = PhaseClock(t0)
        clock.sent(t0 + 0.0005)
        clock.headers(t0 + 0.001)
        clock.body_bytes(t0 + 0.002)
        t = t0 + 0.02
        for k in range(tokens + 3):  # role chunk, tokens, usage chunk, [DONE]
            t += rnd.uniform(0.003, 0.007)
            clock.relay.append(rnd.uniform(3e-6, 9e-6))
            clock.chunk(t)
            if 0 < k <= tokens:
                clock.token(t)
        timing = clock.finish(t + 0.0002, tokens, streaming=True)
        span = telemetry.start(info, "POST", "/v1/chat/completions", "", {}, t0)
        traced = telemetry.conclude(span, "", timing, None)
        out.append(
            RequestRecord(
                trace_id=traced.trace_id, api="chat_completions", operation="chat", model="gpt-4o-mini",
                response_model="gpt-4o-mini-2024-07-18", stream=True, method="POST", path="/v1/chat/completions",
                status_code=200, error_type="", timing=timing, usage=Usage(120 + i % 50, tokens, 64, None),
                usage_source="reported", finish_reasons=("stop",), response_id=f"chatcmpl-{rnd.getrandbits(64):x}",
                provider="openai", sampling=traced.sampling, attributes=attributor(headers, None),
                tcp=TcpStats(rtt=4e-5, rtt_var=1e-5, min_rtt=2e-5, retransmits=0, out_of_order=0, delivery_rate=1_500_000_000), span=traced.span if spans else None,
                upstream="127.0.0.1",
            )
        )  # fmt: skip
    return out


class Discard:
    """A span exporter that drops every batch: the supervisor's replay and queue, no encoding."""

    def export(self, spans: Sequence[Any]) -> bool:
        return True

    def shutdown(self) -> None:
        pass


def _discarding(max_queue_size: int = 2048) -> Any:
    from proxy.telemetry.batch_processor import BatchSpanProcessor
    from proxy.telemetry.tracing import Tracing

    return Tracing(processor=BatchSpanProcessor(Discard(), max_queue_size=max_queue_size))


# ---------------------------------------------------------------- the worker side (a subprocess)


async def _worker(argv: Sequence[str]) -> None:
    from proxy.workers.channel import encode, encode_hello, receive
    from proxy.workers.messages import SCHEMA, VERSION, Hello, Ready, Start
    from proxy.workers.worker import Shipper

    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--long", type=int)
    ap.add_argument("--window", type=int)
    ap.add_argument("--cpu", type=int, default=-1)
    ap.add_argument("--src")
    ap.add_argument("fd", type=int)
    args = ap.parse_args(argv)
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=args.fd))
    writer.write(encode_hello(Hello(VERSION, SCHEMA, os.getpid())))
    start = await receive(reader)
    assert isinstance(start, Start), start
    # Distinct records, more than a batch holds: a pickle would write a record it has seen in the
    # same message as a reference, and look cheaper than it is.
    pool = records(4096, args.long, start.ship_spans, seed=os.getpid())
    try:  # a tree whose workers bin long series when there are several (--src: older trees do not)
        shipper = Shipper(writer, start.max_buffered, binning=start.settings["workers"] > 1)
    except TypeError:
        shipper = Shipper(writer, start.max_buffered)
    writer.write(encode(Ready()))
    await asyncio.sleep(1.0)  # every worker is up before the records flow
    sent, began = 0, time.monotonic()
    rate = args.rate or 50_000.0
    while sent < args.count:
        if shipper.buffered() > args.window:
            await asyncio.sleep(0.0005)  # wait for the supervisor: never drop here
            continue
        # the records due by now, as a serving loop finishes them (a few per loop turn)
        due = min(args.count, sent + 256, int((time.monotonic() - began) * rate) + 1)
        for i in range(sent, due):
            shipper.record(pool[i % len(pool)])
        sent = max(sent, due)
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.1)
    shipper.flush()
    await writer.drain()
    await receive(reader)  # until the supervisor goes away


# ---------------------------------------------------------------- the supervisor side (this process)


def _threads() -> dict[str, int]:
    """CPU ns of each thread of this process, by Python thread name (`/proc/self/task/*/schedstat`)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except OSError:
            continue
        name = names.get(int(tid), "other")
        name = "loop" if name == "MainThread" else name.rstrip("0123456789-_ ")
        out[name] = out.get(name, 0) + ns
    return out


class _Stopwatch:
    """Counts records at the sinks; CPU and wall from the `warmup`-th to the `total`-th."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup, self.total, self.n = warmup, total, 0
        self.cpu0 = self.wall0 = self.cpu1 = self.wall1 = 0.0
        self.threads0: dict[str, int] = {}
        self.threads1: dict[str, int] = {}
        self.done = asyncio.Event()

    def __call__(self, rec: object) -> None:
        self.n += 1
        if self.n == self.warmup:
            self.cpu0, self.wall0, self.threads0 = time.process_time(), time.monotonic(), _threads()
        elif self.n == self.total:
            self.cpu1, self.wall1, self.threads1 = time.process_time(), time.monotonic(), _threads()
            self.done.set()

    def by_thread(self) -> dict[str, float]:
        """µs per record of each thread (the loop, the span exporter's, the GenAI metrics' ...)."""
        n = self.total - self.warmup
        return {
            name: (ns - self.threads0.get(name, 0)) / n / 1e3
            for name, ns in self.threads1.items()
            if ns - self.threads0.get(name, 0) > 0
        }


async def _supervise(args: argparse.Namespace) -> dict[str, float]:
    from prometheus_client import CollectorRegistry

    from proxy.config.settings import Settings
    from proxy.server.lifecycle import settle_heap
    from proxy.telemetry.tracing import shutdown_tracing
    from proxy.workers.supervisor import supervising

    env: dict[str, str] = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    tracing: Any = None
    sink = None
    if args.spans == "discard":
        tracing = _discarding()
    elif args.spans == "off":
        env["OTEL_TRACES_EXPORTER"] = "none"
    if args.spans == "otlp" or args.genai:
        from procs import Proc, free_port, wait_port

        port = free_port()
        sink = Proc("otlp_sink", [sys.executable, str(HERE / "otlp_sink.py"), "--port", str(port)],
                    Path("/tmp") / f"otlp-sink-{port}.log").start()  # fmt: skip
        wait_port(port, 30, sink.popen)
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
        if args.genai:
            env["OTEL_METRICS_EXPORTER"] = "otlp"
    per_worker = args.records // args.workers
    total = per_worker * args.workers
    watch = _Stopwatch(min(args.warmup, total // 2), total)
    command = [sys.executable, __file__, "--worker", "--count", str(per_worker), "--rate", str(args.rate),
               "--long", str(args.long), "--window", str(args.window), "--cpu", "0" if args.pin else "-1",
               "--src", str(args.src)]  # fmt: skip
    settings = Settings(upstream="http://127.0.0.1:9", port=0, metrics_port=0, workers=args.workers, drain_seconds=1)
    if args.pin:
        os.sched_setaffinity(0, {1})
    profiler = None
    try:
        async with supervising(
            settings, on_record=watch, registry=CollectorRegistry(), env=env, worker_command=command,
            tracing=tracing, ready_timeout=30,
        ) as group:  # fmt: skip
            assert group.readiness() == "ready"
            settle_heap()  # as serve_group does once its group is up
            if args.profile:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
            await asyncio.wait_for(watch.done.wait(), args.timeout)
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(args.profile)
            dropped = group.metrics.records_dropped.labels().get()
            spans_dropped = sum(group.metrics.spans_dropped.labels(r).get() for r in ("queue_full", "export_failed"))
    finally:
        if tracing is not None:
            shutdown_tracing(tracing)
        if sink is not None:
            sink.stop()
    n = watch.total - watch.warmup
    cpu, wall = watch.cpu1 - watch.cpu0, watch.wall1 - watch.wall0
    return {
        "records": n, "records_per_s": n / wall, "cpu_us_per_record": cpu / n * 1e6, "dropped": dropped,
        "spans_dropped": spans_dropped,
        **{f"thread {name}": us for name, us in watch.by_thread().items()},
    }  # fmt: skip


def _micro_arm(spans: str, batches: list[list[Any]], loop: asyncio.AbstractEventLoop, per_record: Any,
               out: dict[str, float]) -> None:  # fmt: skip
    """One `--spans` setting of `_micro`: the worker's encode, the supervisor's receive and apply."""
    from prometheus_client import CollectorRegistry

    from proxy.config.accounting import accounting_from
    from proxy.config.settings import Settings
    from proxy.reporting.reporting import Reporting
    from proxy.telemetry.tracing import Tracing, shutdown_tracing
    from proxy.workers import supervisor
    from proxy.workers.channel import encode, receive
    from proxy.workers.messages import Records

    settings = Settings(upstream="http://127.0.0.1:9", port=0, metrics_port=0, workers=2)
    tracing = _discarding(1 << 20) if spans == "discard" else Tracing()
    reporting = Reporting(settings, accounting_from(settings), registry=CollectorRegistry(), tracing=tracing, env={})
    slots = supervisor._slots(2, reporting.spans, {})
    group = supervisor.Group("", "", reporting.metrics, slots)
    sup = supervisor._Supervisor(settings, group, reporting.observers, {}, (), reporting.spans)
    try:  # a tree whose workers bin long series (--src: older trees do not)
        from proxy.workers.binning import binned
    except ImportError:
        binned = None
    if binned is not None:
        per_record(f"worker: bin, spans {spans}", lambda: [binned(r) for b in batches for r in b])
        batches = [[binned(r) for r in b] for b in batches]
    messages = [
        Records(b if spans == "discard" else [dataclasses.replace(r, span=None) for r in b], {}, 0, {}, {})
        for b in batches
    ]
    frames = [encode(m) for m in messages]
    out[f"bytes per record, spans {spans}"] = sum(map(len, frames)) / (64 * len(batches))
    per_record(f"worker: encode, spans {spans}", lambda: [encode(m) for m in messages])

    async def read_all() -> None:
        reader = asyncio.StreamReader()
        for f in frames:
            reader.feed_data(f)
        for _ in frames:
            await receive(reader)

    per_record(f"supervisor: receive, spans {spans}", lambda: loop.run_until_complete(read_all()))
    received = [loop.run_until_complete(_one(f)) for f in frames]
    per_record(f"supervisor: apply, spans {spans}", lambda: [sup._apply(slots[0], m) for m in received])
    shutdown_tracing(tracing)


def _micro(args: argparse.Namespace) -> dict[str, float]:
    """µs per record of each step, on 64-record batches (half 16-token, half `--long`), in this
    process: the worker's `binned` (a tree that has it) and `encode`, the supervisor's `receive` (framing and decoding) and its
    `_apply` (the fan-out to every sink), and the sinks alone for comparison."""
    import timeit

    from prometheus_client import CollectorRegistry

    from proxy.config.accounting import accounting_from
    from proxy.config.settings import Settings
    from proxy.reporting.reporting import Reporting

    out: dict[str, float] = {}
    loop = asyncio.new_event_loop()
    batches = [records(64, args.long, True, seed=s) for s in range(8)]

    def per_record(name: str, fn: Any, number: int = 20) -> None:
        runs = timeit.repeat(fn, number=number, repeat=5)
        out[name] = min(runs) / number / (64 * len(batches)) * 1e6

    for spans in ("off", "discard"):
        _micro_arm(spans, batches, loop, per_record, out)
    settings = Settings(upstream="http://127.0.0.1:9", port=0, metrics_port=0, workers=2)
    plain = [dataclasses.replace(r, span=None) for b in batches for r in b]
    reporting = Reporting(settings, accounting_from(settings), registry=CollectorRegistry(), env={})
    per_record("sink alone: metrics.record", lambda: [reporting.metrics.record(r) for r in plain])
    assert reporting.live is not None
    live = reporting.live
    per_record("sink alone: live view", lambda: [live.observe(r) for r in plain])
    loop.close()
    return out


async def _one(frame: bytes) -> Any:
    from proxy.workers.channel import receive

    reader = asyncio.StreamReader()
    reader.feed_data(frame)
    return await receive(reader)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        import uvloop

        uvloop.run(_worker(sys.argv[2:]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--records", type=int, default=40_000, help="in all, over the workers")
    ap.add_argument("--warmup", type=int, default=4_000, help="records before the clock starts")
    ap.add_argument("--rate", type=float, default=2500.0, help="records/s each worker offers (0: as fast as read)")
    ap.add_argument("--long", type=int, default=256, help="tokens of every other record (the rest: 16)")
    ap.add_argument("--window", type=int, default=1 << 20, help="bytes a worker leaves unread before it waits")
    ap.add_argument("--spans", choices=("off", "discard", "otlp"), default="off")
    ap.add_argument("--genai", action="store_true", help="the OTLP GenAI metrics too (to otlp_sink.py)")
    ap.add_argument("--pin", action="store_true", help="supervisor on CPU 1, workers on CPU 0")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--src", type=Path, default=_src(sys.argv), help="the tree holding the proxy/ to run")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--profile", type=Path, help="write a cProfile of the supervisor (after the warm-up) here")
    ap.add_argument("--micro", action="store_true", help="each step alone, µs per record (--ab: two trees)")
    ap.add_argument("--ab", type=Path, help="with --micro: a second tree, run in turns with --src (best of 3)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.micro:
        if args.json:
            print(json.dumps(_micro(args)))
            return
        trees = [args.src, *([args.ab] if args.ab else [])]
        from procs import best_of_runs

        def run(tree: Path) -> dict[str, float]:
            argv = [sys.executable, __file__, "--micro", "--json", "--src", str(tree), "--long", str(args.long)]
            return dict(json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout))

        best = best_of_runs(trees, run, 3)
        print(f"{'µs per record (best of 3)':40s}" + "".join(f"{t.name[-16:]:>18s}" for t in trees))
        for name in best[trees[0]]:
            print(f"{name:40s}" + "".join(f"{best[t].get(name, float('nan')):18.2f}" for t in trees))
        return
    import uvloop

    records(2, args.long, True)  # fails here, not in every worker
    for _ in range(args.repeat):
        got = uvloop.run(_supervise(args))
        print(
            f"{args.src.name}: workers {args.workers}  spans {args.spans}  genai {args.genai}  rate {args.rate or 'max'}: "
            f"{got['records']:.0f} records, {got['records_per_s']:,.0f} records/s, "
            f"supervisor CPU {got['cpu_us_per_record']:.1f} us/record "
            f"(1 core: {1e6 / got['cpu_us_per_record']:,.0f} records/s), dropped {got['dropped']:.0f}, spans dropped {got['spans_dropped']:.0f}; by thread: "
            + ", ".join(f"{k[7:]} {v:.1f}" for k, v in got.items() if k.startswith("thread ")),
            flush=True,
        )


if __name__ == "__main__":
    main()
