"""Proxy CPU per request, A/B: each arm's `python -m proxy serve` under the same steady load, in turns.

    python tests/bench/cpu_per_request.py --arm new=. --arm base=/tmp/base --repeat 3
    python tests/bench/cpu_per_request.py --arm new=. --arm base=/tmp/base --otlp   # spans to a live sink
    python tests/bench/cpu_per_request.py --arm new=. --arm base=/tmp/base --callgrind \
        --concurrency 4 --interval-ms 10 --seconds 15                             # instructions instead
    python tests/bench/cpu_per_request.py --arm one=. --arm w2=.@2 --otlp       # one process against --workers 2

One bench upstream (`upstream.py`, 20 ms TTFT, 1 ms between tokens) and, with `--otlp`, one OTLP
sink serve every arm. Each round starts each arm's proxy afresh, warms it up, then reads the CPU
of its threads (/proc/<pid>/task/*/schedstat, ns) around `load.py` (C streams started together,
repeated for S seconds) and divides by the streams completed. Arms alternate within a round, so
a noisy neighbour on a shared machine hits both; on a busy host they still differ by tens of µs
from round to round. `--callgrind` counts each proxy's user-space instructions instead
(valgrind, ~50x slower), which other processes do not disturb: rounds agree within ~0.5 %.
An arm is a directory holding a `proxy/` package (a checkout or `git worktree add /tmp/base main`),
and `@N` after it runs `serve --workers N`: the CPU is then the whole group's (supervisor and
workers, every thread; not with `--callgrind`).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from procs import Proc, cpu_ns, free_port, load_streams, wait_port

HERE = Path(__file__).resolve().parent
PY = sys.executable


def _callgrind(action: str, pid: int, out: Path) -> int:
    """Zero (`-z`) or dump (`-d`) the callgrind counters of `pid` (its output `out`.<pid>); a dump
    returns its instructions."""
    mine = out.parent / f"{out.name}.{pid}"
    before = set(out.parent.glob(mine.name + ".*"))
    subprocess.run(["callgrind_control", action, str(pid)], capture_output=True, check=True)
    if action != "-d":
        return 0
    for _ in range(100):
        new = set(out.parent.glob(mine.name + ".*")) - before
        text = next(iter(new)).read_text(errors="replace") if new else ""
        m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        if m:
            return int(m.group(1))
        time.sleep(0.1)
    raise RuntimeError("callgrind wrote no dump")


def measure(
    src: Path, env: dict[str, str], upstream: int, args: argparse.Namespace, logdir: Path, workers: int = 1
) -> float:
    """µs of proxy CPU per completed stream (with --callgrind: instructions), one fresh proxy from
    `src` (a group of `workers` when more than one: every process of it)."""
    port, mport = free_port(), free_port()
    out = logdir / f"callgrind-{src.name}-{port}.out"
    wrap = (
        ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={out}.%p"]
        if args.callgrind
        else []
    )
    group = ["--workers", str(workers)] if workers > 1 else []
    proc = Proc(
        "proxy",
        [*wrap, PY, "-m", "proxy", "serve", "--upstream", f"http://127.0.0.1:{upstream}",
         "--port", str(port), "--metrics-port", str(mport), *group],
        logdir / f"proxy-{src.name}.log", env=env, cwd=str(src),
    ).start()  # fmt: skip
    try:
        wait_port(port, 300 if args.callgrind else 30, proc.popen)
        if workers > 1:
            time.sleep(40.0 if args.callgrind else 2.0)  # every worker listening, not only the first
        load_streams(port, args.concurrency, args.tokens, args.warmup)
        if args.callgrind:
            group = proc.pids(refresh=True)  # every process of a group runs under valgrind too
            for pid in group:
                _callgrind("-z", pid, out)
            if args.idle:  # what the process costs with nothing to serve, per second
                time.sleep(args.seconds)
                return sum(_callgrind("-d", pid, out) for pid in group) / args.seconds
            streams = load_streams(port, args.concurrency, args.tokens, args.seconds)
            total = sum(_callgrind("-d", pid, out) for pid in group)
            print(f"  {total} instructions, {streams} streams in {args.seconds:g} s", flush=True)
            return total / streams
        pids = proc.pids(refresh=True)
        before = cpu_ns(pids)
        streams = load_streams(port, args.concurrency, args.tokens, args.seconds)
        return (cpu_ns(pids) - before) / streams / 1e3
    finally:
        proc.popen.terminate()  # type: ignore[union-attr]
        proc.popen.wait(60)  # type: ignore[union-attr]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", action="append", required=True, help="NAME=DIR (a directory with proxy/)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument(
        "--otlp", action="store_true", help="export spans to a live OTLP sink (else OTEL_TRACES_EXPORTER=none)"
    )
    ap.add_argument("--interval-ms", type=float, default=1.0, help="the upstream's gap between tokens")
    ap.add_argument(
        "--callgrind",
        action="store_true",
        help="count the proxy's instructions per request under valgrind instead (~50x slower, but deaf to "
        "other processes: use --concurrency 4 --interval-ms 10 so that reads do not merge)",
    )
    ap.add_argument(
        "--idle", action="store_true", help="with --callgrind: instructions per second with no load (after the warm-up)"
    )
    ap.add_argument("--logs", type=Path, default=Path("/tmp/cpu_per_request"))
    args = ap.parse_args()
    arms = {name: d for name, _, d in (a.partition("=") for a in args.arm)}
    args.logs.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TAOTRACE_"))}
    upstream = free_port()
    helpers = [
        Proc("upstream", [PY, str(HERE / "upstream.py"), "--port", str(upstream), "--ttft-ms", "20",
                          "--interval-ms", str(args.interval_ms)], args.logs / "upstream.log", env=env).start()
    ]  # fmt: skip
    wait_port(upstream, 30, helpers[0].popen)
    penv = dict(env)
    if args.otlp:
        sink = free_port()
        helpers.append(
            Proc("sink", [PY, str(HERE / "otlp_sink.py"), "--port", str(sink)], args.logs / "sink.log", env=env).start()
        )
        wait_port(sink, 30, helpers[-1].popen)
        penv.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{sink}", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    else:
        penv["OTEL_TRACES_EXPORTER"] = "none"
    results: dict[str, list[float]] = {name: [] for name in arms}
    unit = ("instructions/s idle" if args.idle else "instructions/request") if args.callgrind else "us/request"
    try:
        for i in range(args.repeat):
            for name, spec in arms.items() if i % 2 == 0 else reversed(arms.items()):
                src, _, workers = spec.partition("@")
                us = measure(Path(src).resolve(), penv, upstream, args, args.logs, int(workers or 1))
                results[name].append(us)
                print(f"round {i + 1} {name}: {us:.0f} {unit}", flush=True)
                time.sleep(0.5)
    finally:
        for h in helpers:
            h.popen.terminate()  # type: ignore[union-attr]
    for name, values in results.items():
        print(f"{name}: median {statistics.median(values):.0f} {unit}, "
              f"range {min(values):.0f}-{max(values):.0f} ({', '.join(f'{v:.0f}' for v in values)})")  # fmt: skip


if __name__ == "__main__":
    main()
