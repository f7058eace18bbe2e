"""Side-by-side overhead benchmark: direct vs nginx vs taotrace (export on/off, 1 or 2 workers) vs LiteLLM.

    make bench                      # full run (~15 min on 2 cores)
    make bench ARGS=--quick         # ~2 min, for iteration
    python tests/bench/run.py --help

Everything runs on loopback. The bench upstream (`upstream.py`), the OTLP sink and this client
share core 0; the proxy under test gets core 1 to itself (`taskset`), except the two-worker arms
(`taotrace-w2`: `--workers 2`; `nginx-w2`: `worker_processes 2`), which get both cores and so
share core 0 with the load. `taotrace-mirror` is `taotrace` with `--mirror`
at ratio 1 and its caps lifted (`--mirror-concurrency 1000`): every request also copied, in the
same process on core 1, to a second bench upstream on core 0; set beside `taotrace` (mirroring
off, the same code otherwise), its added TTFT says what mirroring costs the client, and its CPU
what the copies cost the proxy. After the sweep, each arm's throughput at
saturation: 16-token streams, 256 started together, batch after batch (`--saturation-seconds`).
Arms are interleaved batch by batch (A B C D E, B C D E A, ...), after a discarded warm-up. A
batch is C streams started together on pre-opened keep-alive connections; TTFT runs from the
moment a request is written to the arrival of the first token event. Proxy CPU comes from /proc/<pid>/task/*/schedstat
(nanoseconds), memory from VmRSS, both summed over the proxy's process tree.

First token against the upstream's own write: for the taotrace arms, the bench upstream keeps
the instant it wrote each stream's token 0 (keyed by the trace id in the `traceparent` taotrace
sends it) and the proxy's live view gives its own first-token instant per trace id
(`first_token_monotonic` of `/api/requests`, read between batches before the ring forgets it);
both are CLOCK_MONOTONIC, so the difference is how late the proxy stamped the token. For
`direct` the client sends the traceparent and its own arrival stamp stands in: the floor.

Results: a table on stdout, JSON in tests/bench/results/ (latest.json and a dated copy), and
every child's log beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from client import HOLD_MODEL, MODEL, SATURATE_MODEL, Pool, StreamStats, analyse, request_bytes  # noqa: E402
from payload import run as aio_run  # noqa: E402
from procs import Proc, free_port, http_get, wait_port  # noqa: E402
from samples import batch_spread, first_token_lags, lag_summary, pct, proxy_first_tokens  # noqa: E402

PY = sys.executable
LOAD_CPU, PROXY_CPU = "0", "1"
ARM_ORDER = (
    "direct", "nginx", "nginx-w2", "taotrace", "taotrace-mirror", "taotrace-w2", "taotrace-metrics",
    "taotrace-noexport", "taotrace-baseline", "litellm",
)  # fmt: skip
BOTH_CPUS = "0,1"  # the two-worker arms run on both cores (beside the load generator on core 0)
HOLD_TOKENS = 4
UI_RING = 1000  # the live view's ring at its default --ui-requests: rows are read before it wraps
SATURATION = 256  # streams at a time in the throughput test: more than one core forwards
MS = 1e6  # ns per ms

# --------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Plan:
    """What to run: cells (concurrency x length), batches per cell, rounds."""

    concurrency: tuple[int, ...]
    lengths: tuple[int, ...]
    rounds: int
    samples: int  # TTFT samples per cell per round for 16-token streams (fewer for longer)
    hold: int
    ttft_ms: float
    interval_ms: float
    saturation_seconds: float = 8.0  # per arm: 16-token streams, SATURATION at a time, back to back

    def reps(self, conc: int, tokens: int) -> int:
        """Batches per arm per round: many short streams (TTFT p99), few long ones (CPU, gaps)."""
        per_round = max(1, self.samples * 16 // max(16, tokens))
        return max(1, math.ceil(per_round / conc))

    def est_seconds(self, arms: int) -> float:
        total = 0.0
        for c in self.concurrency:
            for n in self.lengths:
                batch = (self.ttft_ms + n * self.interval_ms) / 1e3 + 0.02
                total += self.reps(c, n) * batch * (1 if n >= 1024 else self.rounds)
        return total * arms


def make_plan(args: argparse.Namespace) -> Plan:
    quick = args.quick
    conc = tuple(args.concurrency or (1, 8, 32, 128, 1000))
    lengths = tuple(args.lengths or ((16, 256) if quick else (16, 256, 1024)))
    return Plan(
        concurrency=conc,
        lengths=lengths,
        rounds=args.rounds or (1 if quick else 2),
        samples=args.samples or (20 if quick else 120),
        hold=args.hold or (300 if quick else 1000),
        ttft_ms=args.ttft_ms,
        interval_ms=args.interval_ms,
        saturation_seconds=args.saturation_seconds if args.saturation_seconds is not None else (4.0 if quick else 8.0),
    )


# --------------------------------------------------------------------------------------- arms


@dataclass
class Arm:
    """One way to reach the upstream, and the process (if any) that is measured."""

    name: str
    port: int
    proc: Proc | None = None
    metrics_port: int | None = None
    pool: Pool = field(init=False)
    pending: tuple[Cell, int, int] | None = None  # (cell, batch index, cpu ns at batch start)
    rss: dict[str, int] = field(default_factory=dict)
    # the live view's rows read so far: trace id -> the proxy's first-token instant (CLOCK_MONOTONIC s)
    first_tokens: dict[str, float] = field(default_factory=dict)
    ui_seq: int = 0  # the last ring seq read
    ui_unread: int = 0  # rows added since the last read (the ring keeps UI_RING)
    rows_per_request: int = 1  # taotrace-mirror: the copy is a row of its own

    def __post_init__(self) -> None:
        self.pool = Pool("127.0.0.1", self.port)

    def cpu(self) -> int:
        return self.proc.cpu_ns() if self.proc else 0

    def rss_kib(self) -> int:
        return self.proc.rss_kib() if self.proc else 0


@dataclass
class Cell:
    """Samples of one (arm, concurrency, stream length)."""

    arm: str
    conc: int
    tokens: int
    ttft: array = field(default_factory=lambda: array("q"))
    ttfb: array = field(default_factory=lambda: array("q"))
    gaps: array = field(default_factory=lambda: array("q"))
    max_gap: int = 0
    streams: int = 0
    ok: int = 0
    exact: int = 0
    events: int = 0
    errors: Counter = field(default_factory=Counter)
    batches: list[list[int]] = field(default_factory=list)  # [requests, events, cpu ns]
    upstream_first: list[dict[str, float]] = field(default_factory=list)  # per batch: trace id -> token 0 written


class Bench:
    """Starts everything, runs the plan, reduces the samples."""

    def __init__(self, args: argparse.Namespace, plan: Plan, outdir: Path) -> None:
        self.args = args
        self.plan = plan
        self.out = outdir
        self.procs: list[Proc] = []
        self.arms: dict[str, Arm] = {}
        self.skipped: dict[str, str] = {}
        self.cells: dict[tuple[str, int, int], Cell] = {}
        self.upstream_port = 0
        self.mirror_port = 0  # the second bench upstream, taotrace-mirror's copies' (0: not started)
        self.sink_port = 0
        self.hold: dict[str, dict[str, object]] = {}
        self.checks: dict[str, object] = {}
        # (arm, concurrency) -> [request sum, request count, relay sum, relay count] of the arm's own
        # taotrace_proxy_overhead_seconds over that concurrency's measured batches
        self.overhead: dict[tuple[str, int], list[float]] = {}
        self.throughput: dict[str, dict[str, float]] = {}

    # ------------------------------------------------------------------ processes
    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def _start(self, proc: Proc, port: int, timeout: float = 30.0) -> Proc:
        proc.nice = self.args.nice
        self.procs.append(proc.start())
        try:
            wait_port(port, timeout, proc.popen)
        except Exception as exc:
            raise RuntimeError(f"{proc.name} did not start: {exc}\n{proc.tail()}") from exc
        return proc

    def start_all(self, wanted: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TAOTRACE_"))}
        self.upstream_port = self._start_upstream("upstream", env)
        upstream_url = f"http://127.0.0.1:{self.upstream_port}"
        if "direct" in wanted:
            self.arms["direct"] = Arm("direct", self.upstream_port)
        for name in ("nginx", "nginx-w2"):
            if name in wanted:
                self._start_nginx(env, name)
        for name in (
            "taotrace",
            "taotrace-mirror",
            "taotrace-w2",
            "taotrace-metrics",
            "taotrace-noexport",
        ):
            if name in wanted:
                self._start_taotrace(name, env, upstream_url)
        if self.args.baseline:
            self._start_taotrace("taotrace-baseline", env, upstream_url, src=self._export_baseline(self.args.baseline))
        if "litellm" in wanted:
            self._start_litellm(env)
        self.arms = {n: self.arms[n] for n in ARM_ORDER if n in self.arms}

    def _start_upstream(self, name: str, env: dict[str, str]) -> int:
        """A bench upstream on the load's core; its port."""
        port = free_port()
        argv = [PY, str(HERE / "upstream.py"), "--port", str(port), "--ttft-ms", str(self.plan.ttft_ms)]
        argv += ["--interval-ms", str(self.plan.interval_ms)]
        self._start(Proc(name, argv, self.out / f"{name}.log", cpus=LOAD_CPU, env=env), port)
        return port

    def _start_nginx(self, env: dict[str, str], name: str = "nginx") -> None:
        nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
        if nginx is None and not self.args.no_install and os.geteuid() == 0:
            self.log("installing nginx (apt-get)")
            subprocess.run(
                "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx",
                shell=True,
                check=False,
                stdout=subprocess.DEVNULL,
            )
            nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
        if nginx is None:
            self.skipped[name] = "nginx not installed (apt-get install nginx)"
            return
        workers = 2 if name == "nginx-w2" else 1
        prefix = self.out / name
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (prefix / "tmp" / sub).mkdir(parents=True, exist_ok=True)
        port = free_port()
        conf = (
            (HERE / "nginx.conf.template")
            .read_text()
            .format(
                prefix=prefix,
                port=port,
                upstream_port=self.upstream_port,
                workers=workers,
                # bit masks: core PROXY_CPU alone, or one core per worker
                affinity="01 10" if workers == 2 else "1" + "0" * int(PROXY_CPU),
            )
        )
        (prefix / "nginx.conf").write_text(conf)
        proc = Proc(
            name,
            [nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", str(prefix / "error.log")],
            self.out / f"{name}.log",
            cpus=BOTH_CPUS if workers == 2 else PROXY_CPU,
            env=env,
        )
        self._start(proc, port)
        self.arms[name] = Arm(name, port, proc)

    def _export_baseline(self, ref: str) -> Path:
        """`proxy/` as of a git ref, unpacked beside the results (the repository is not touched).

        A directory that holds a `proxy/` package is used as it is (an uncommitted experiment).
        """
        if (Path(ref) / "proxy" / "__init__.py").exists():
            return Path(ref).resolve()
        dest = self.out / f"baseline-{ref.replace('/', '_')}"
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", ref, "proxy"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return dest

    def _start_taotrace(self, name: str, env: dict[str, str], upstream_url: str, src: Path = ROOT) -> None:
        """taotrace from `src` (this checkout, or an exported baseline: `python -m proxy` runs from cwd)."""
        probe = subprocess.run([PY, "-c", "import proxy.serve"], cwd=src, capture_output=True, text=True)
        if probe.returncode != 0:
            self.skipped[name] = "proxy.serve not importable: " + (probe.stderr.strip().splitlines() or ["?"])[-1]
            return
        port, mport = free_port(), free_port()
        penv = dict(env)
        if name != "taotrace-noexport":
            if not self.sink_port:
                self.sink_port = free_port()
                self._start(
                    Proc(
                        "otlp-sink",
                        [PY, str(HERE / "otlp_sink.py"), "--port", str(self.sink_port)],
                        self.out / "otlp-sink.log",
                        cpus=LOAD_CPU,
                        env=env,
                    ),
                    self.sink_port,
                )
            penv.update(
                OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{self.sink_port}",
                OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                OTEL_SERVICE_NAME=f"taotrace-bench-{name}",  # the sink counts spans per arm
            )
        if name == "taotrace-metrics":  # spans as in `taotrace`, plus the GenAI metrics over OTLP
            penv.update(OTEL_METRICS_EXPORTER="otlp", OTEL_METRIC_EXPORT_INTERVAL="5000")
        if name == "taotrace-baseline":
            penv.update(kv.split("=", 1) for kv in self.args.baseline_env)  # type: ignore[misc]
        argv = [
            PY,
            "-m",
            "proxy",
            "serve",
            "--upstream",
            upstream_url,
            "--port",
            str(port),
            "--metrics-port",
            str(mport),
        ]
        if name == "taotrace-w2":
            argv += ["--workers", "2"]  # each worker exports its own spans
        if name == "taotrace-mirror":  # every request copied: the worst case mirroring can cost
            if not self.mirror_port:
                self.mirror_port = self._start_upstream("mirror-upstream", env)
            argv += ["--route", f"mirror:/mirror=http://127.0.0.1:{self.mirror_port}", "--mirror", "mirror"]
            argv += ["--mirror-ratio", "1", "--mirror-max-per-minute", str(10**9), "--mirror-concurrency", "1000"]
        proc = Proc(
            name,
            argv,
            self.out / f"{name}.log",
            cpus=BOTH_CPUS if name == "taotrace-w2" else PROXY_CPU,
            env=penv,
            cwd=str(src),
        )
        self._start(proc, port)
        self.arms[name] = Arm(name, port, proc, metrics_port=mport)
        if name == "taotrace-mirror":
            self.arms[name].rows_per_request = 2

    def _start_litellm(self, env: dict[str, str]) -> None:
        script = HERE / "litellm.sh"
        venv_bin = HERE / ".litellm-venv" / "bin" / "litellm"
        if not self.args.no_install:
            r = subprocess.run(["bash", str(script), "install"], check=False)
            if r.returncode != 0:
                self.skipped["litellm"] = "litellm install failed (tests/bench/litellm.sh install)"
                return
        if not venv_bin.exists():
            self.skipped["litellm"] = "not installed (tests/bench/litellm.sh install)"
            return
        port = free_port()
        cfg = self.out / "litellm_config.yaml"
        cfg.write_text((HERE / "litellm_config.yaml.template").read_text().format(upstream_port=self.upstream_port))
        proc = Proc(
            "litellm",
            ["bash", str(script), "run", str(cfg), str(port)],
            self.out / "litellm.log",
            cpus=PROXY_CPU,
            env=env,
        )
        self._start(proc, port, timeout=180)
        self.arms["litellm"] = Arm("litellm", port, proc)

    def stop_all(self) -> None:
        for arm in self.arms.values():
            arm.pool.close()
        for proc in reversed(self.procs):
            proc.stop()

    # ------------------------------------------------------------------ measuring
    def cell(self, arm: str, conc: int, tokens: int) -> Cell:
        key = (arm, conc, tokens)
        if key not in self.cells:
            self.cells[key] = Cell(arm, conc, tokens)
        return self.cells[key]

    def _close_pending(self, arm: Arm) -> None:
        """CPU from a batch's start to the arm's next batch: deferred work (span export) counts."""
        if arm.pending is not None:
            cell, idx, cpu0 = arm.pending
            cell.batches[idx][2] = arm.cpu() - cpu0
            arm.pending = None

    async def batch(self, arm: Arm, conc: int, tokens: int, record: bool, model: str = MODEL) -> list[StreamStats]:
        conns, new = await arm.pool.acquire(conc)
        if new:
            await asyncio.sleep(0.01)  # let the proxy finish accepting before the clock starts
        raw = request_bytes("127.0.0.1", arm.port, "/v1/chat/completions", model, tokens)
        self._close_pending(arm)
        rows = conc * arm.rows_per_request
        if record and arm.metrics_port and arm.ui_unread + rows > UI_RING:
            await self.read_first_tokens(arm)  # before this batch pushes unread rows out of the ring
        arm.ui_unread += rows
        # direct: the client's own first-token arrival against the upstream's write, the floor of
        # that measurement on this host (the client sends the traceparent a proxy would)
        floor = record and arm.name == "direct"
        trace_ids = [os.urandom(16).hex() for _ in conns] if floor else []
        raws = (
            [
                request_bytes("127.0.0.1", arm.port, "/v1/chat/completions", model, tokens, f"00-{t}-{'1' * 16}-01")
                for t in trace_ids
            ]
            if floor
            else [raw] * len(conns)
        )
        cpu0 = arm.cpu()
        futs = [c.send(r) for c, r in zip(conns, raws, strict=True)]
        timeout = 30 + 20 * (self.plan.ttft_ms + tokens * self.plan.interval_ms) / 1e3
        done, pending = await asyncio.wait(futs, timeout=timeout)
        results: list[StreamStats] = []
        for f in futs:
            if f in done:
                results.append(analyse(f.result(), model, tokens))
            else:
                results.append(StreamStats(False, False, -1, -1, [], 0, "timeout"))
        arm.pool.release(conns)
        for tid, f, s in zip(trace_ids, futs, results, strict=False):
            if s.ok:
                arm.first_tokens[tid] = (f.result().t_send + s.ttft) / 1e9  # perf_counter_ns: CLOCK_MONOTONIC
        if record:
            cell = self.cell(arm.name, conc, tokens)
            events = 0
            for s in results:
                cell.streams += 1
                events += s.events
                if s.ok:
                    cell.ok += 1
                    cell.ttft.append(s.ttft)
                    cell.ttfb.append(s.ttfb)
                    cell.gaps.extend(s.gaps)
                    if s.gaps:
                        cell.max_gap = max(cell.max_gap, max(s.gaps))
                else:
                    cell.errors[s.error or "?"] += 1
                cell.exact += s.exact
            cell.events += events
            cell.batches.append([conc, events, 0])
            arm.pending = (cell, len(cell.batches) - 1, cpu0)
            if arm.metrics_port or floor:  # this batch's token-0 writes (the upstream is on the load's core)
                cell.upstream_first.append(await self.upstream_first_tokens())
        await asyncio.sleep(0.005)
        return results

    async def sanity(self) -> None:
        for arm in self.arms.values():
            res = await self.batch(arm, 1, 8, record=False)
            s = res[0]
            self.checks[f"{arm.name}_sanity"] = {"ok": s.ok, "exact": s.exact, "error": s.error}
            self.log(f"sanity {arm.name:18} ok={s.ok} byte-exact={s.exact} ttft={s.ttft / MS:.2f}ms {s.error or ''}")

    async def warmup(self) -> None:
        # At most 128 at a time: the hold test comes next and must be the first to open 1,000
        # connections (a heap already grown by a 1,000-stream batch reads ~0 KiB per idle stream).
        for conc in sorted({1, *(min(c, 128) for c in self.plan.concurrency)}):
            for _ in range(5 if conc == 1 else 2):
                for arm in self.arms.values():
                    await self.batch(arm, conc, 16, record=False)

    async def upstream_first_tokens(self) -> dict[str, float]:
        """The upstream's token-0 instants since the last call (it forgets them on reading)."""
        got = await http_get_json(self.upstream_port, "/bench/first_tokens")
        if self.mirror_port:  # the copies' own: not compared with anything, but not left to pile up
            await http_get_json(self.mirror_port, "/bench/first_tokens")
        return {k: v for k, v in got.items() if isinstance(v, float)}

    async def read_first_tokens(self, arm: Arm, settle: float = 0.05) -> None:
        """The arm's live-view rows since the last read: its first-token instant per trace id.

        `settle` first: with workers, records reach the supervisor's ring in batches of up to 20 ms.
        A read is between batches, after the CPU of the last one is closed: it counts in none."""
        await asyncio.sleep(settle)
        assert arm.metrics_port
        got = await http_get_json(arm.metrics_port, f"/api/requests?limit={UI_RING}&since={arm.ui_seq}")
        rows, seq = got.get("requests"), got.get("last_seq")
        if isinstance(rows, list) and isinstance(seq, int):
            arm.first_tokens.update(proxy_first_tokens(rows))
            arm.ui_seq = seq
        arm.ui_unread = 0
        await asyncio.sleep(0.005)  # the proxy closes that connection before the next batch

    async def sweep(self) -> None:
        arms = list(self.arms.values())
        await self.upstream_first_tokens()  # forget the warm-up's and the hold test's
        for arm in arms:
            if arm.metrics_port:
                await self.read_first_tokens(arm, settle=0.1)  # the cursor: rows from here on
        for rnd in range(self.plan.rounds):
            t0 = time.monotonic()
            for conc in self.plan.concurrency:
                before = await self.overhead_snapshot()
                for tokens in self.plan.lengths:
                    if tokens >= 1024 and rnd > 0:
                        continue  # long streams once: they feed CPU/event and gaps, and cost minutes
                    for rep in range(self.plan.reps(conc, tokens)):
                        k = (rep + rnd) % len(arms)
                        for arm in arms[k:] + arms[:k]:
                            await self.batch(arm, conc, tokens, record=True)
                after = await self.overhead_snapshot()
                await asyncio.sleep(0.05)  # let the last records reach the rings
                for arm in arms:
                    if arm.metrics_port:
                        await self.read_first_tokens(arm, settle=0.0)
                for name, values in after.items():
                    acc = self.overhead.setdefault((name, conc), [0.0, 0.0, 0.0, 0.0])
                    for i, v in enumerate(values):
                        acc[i] += v - before[name][i]
            await asyncio.sleep(1.0)
            for arm in arms:
                self._close_pending(arm)
                arm.rss[f"after_round_{rnd + 1}"] = arm.rss_kib()
            self.log(f"round {rnd + 1}/{self.plan.rounds} done in {time.monotonic() - t0:.0f}s")

    async def saturation(self, arm: Arm) -> None:
        """Requests/s of 16-token streams, SATURATION started together, batch after batch; the
        upstream paces these at 1 ms per token, so the proxy's CPU is what limits the rate."""
        if self.plan.saturation_seconds <= 0:
            return
        self._close_pending(arm)
        cpu0, t0, ok, total = arm.cpu(), time.monotonic(), 0, 0
        while time.monotonic() - t0 < self.plan.saturation_seconds:
            results = await self.batch(arm, SATURATION, 16, record=False, model=SATURATE_MODEL)
            ok += sum(s.ok and s.exact for s in results)
            total += len(results)
        elapsed = time.monotonic() - t0
        cpu = (arm.cpu() - cpu0) / 1e9
        self.throughput[arm.name] = {
            "requests_per_s": ok / elapsed,
            "streams": total,
            "byte_exact": ok,
            "cpu_cores": cpu / elapsed if arm.proc else 0.0,
        }
        self.log(f"saturation {arm.name:18} {ok / elapsed:7.0f} req/s ({ok}/{total} exact), {cpu / elapsed:.2f} cores")

    async def hold_test(self, arm: Arm) -> None:
        """Hold N streams open after their first token; RSS per stream; then finish them all."""
        n = self.plan.hold
        await asyncio.sleep(0.5)
        rss0 = arm.rss_kib()
        t0 = time.monotonic()
        try:
            conns, _ = await arm.pool.acquire(n)
        except OSError as exc:
            self.hold[arm.name] = {"streams": n, "error": f"connect: {exc}"}
            return
        loop = asyncio.get_running_loop()
        firsts = [loop.create_future() for _ in conns]
        raw = request_bytes("127.0.0.1", arm.port, "/v1/chat/completions", HOLD_MODEL, HOLD_TOKENS)
        futs = []
        for c, f in zip(conns, firsts, strict=False):
            futs.append(c.send(raw, on_first=lambda f=f: f.done() or f.set_result(None)))
            await asyncio.sleep(0)  # a client-side burst of 1,000 writes is fine; let reads in
        await asyncio.wait(firsts, timeout=60)
        opened = sum(f.done() for f in firsts)
        await asyncio.sleep(1.0)
        rss1 = arm.rss_kib()
        released = await http_get_json(self.upstream_port, "/bench/release")
        if self.mirror_port:  # taotrace-mirror's copies of the held streams are held there
            await http_get_json(self.mirror_port, "/bench/release")
        done, _ = await asyncio.wait(futs, timeout=60)
        results = [
            analyse(f.result(), HOLD_MODEL, HOLD_TOKENS)
            if f in done
            else StreamStats(False, False, -1, -1, [], 0, "timeout")
            for f in futs
        ]
        arm.pool.release(conns)
        arm.pool.close()
        await asyncio.sleep(2.0)
        rss2 = arm.rss_kib()
        errors = Counter(s.error for s in results if not s.ok)
        self.hold[arm.name] = {
            "streams": n,
            "opened": opened,
            "completed_ok": sum(s.ok for s in results),
            "byte_exact": sum(s.exact for s in results),
            "errors": dict(errors),
            "released_by_upstream": released.get("released"),
            "rss_before_kib": rss0,
            "rss_open_kib": rss1,
            "rss_after_kib": rss2,
            "kib_per_stream": (rss1 - rss0) / opened if arm.proc and opened else None,
            "seconds": round(time.monotonic() - t0, 1),
        }
        self.log(
            f"hold {arm.name:18} {opened}/{n} open, {self.hold[arm.name]['completed_ok']} ok, "
            f"{((rss1 - rss0) / max(opened, 1)) if arm.proc else 0:.1f} KiB/stream"
        )

    async def overhead_snapshot(self) -> dict[str, list[float]]:
        """Each taotrace arm's own overhead histogram totals, scraped between batches (their CPU
        accounting is closed first, so a render never counts as a batch's deferred work)."""
        out: dict[str, list[float]] = {}
        for arm in self.arms.values():
            if not arm.metrics_port:
                continue
            self._close_pending(arm)
            totals = [0.0, 0.0, 0.0, 0.0]
            for line in (await http_get_text(arm.metrics_port, "/metrics")).splitlines():
                if not line.startswith("taotrace_proxy_overhead_seconds_"):
                    continue
                relay = 'stage="relay"' in line
                if line.startswith("taotrace_proxy_overhead_seconds_sum{"):
                    totals[2 if relay else 0] += float(line.rsplit(" ", 1)[1])
                elif line.startswith("taotrace_proxy_overhead_seconds_count{"):
                    totals[3 if relay else 1] += float(line.rsplit(" ", 1)[1])
            out[arm.name] = totals
        return out

    async def collect_checks(self) -> None:
        if self.sink_port:
            self.checks["otlp_sink"] = await http_get_json(self.sink_port, "/stats")
        for arm in self.arms.values():
            if arm.metrics_port:
                text = await http_get_text(arm.metrics_port, "/metrics")
                totals = Counter[str]()
                for line in text.splitlines():
                    for family in ("taotrace_requests_total", "taotrace_mirror_requests_total"):
                        if line.startswith(family + "{"):
                            totals[family] += float(line.rsplit(" ", 1)[1])
                    if line.startswith("taotrace_mirror_dropped_total{"):
                        totals["mirror_dropped"] += float(line.rsplit(" ", 1)[1])
                self.checks[f"{arm.name}_requests_total"] = totals["taotrace_requests_total"]
                if arm.name == "taotrace-mirror":
                    self.checks["mirror_copies_total"] = totals["taotrace_mirror_requests_total"]
                    self.checks["mirror_dropped_total"] = totals["mirror_dropped"]

    async def main(self) -> None:
        self.log("sanity check (one 8-token stream per arm)")
        await self.sanity()
        self.log("warm-up (discarded)")
        await self.warmup()
        await asyncio.sleep(1.0)
        for arm in self.arms.values():
            arm.rss["after_warmup"] = arm.rss_kib()
        for arm in self.arms.values():
            await self.hold_test(arm)
        est = self.plan.est_seconds(len(self.arms))
        self.log(
            f"sweep: {len(self.arms)} arms x {len(self.plan.concurrency)} x {len(self.plan.lengths)} cells "
            f"x {self.plan.rounds} rounds (~{est:.0f}s if no arm is overloaded)"
        )
        await self.sweep()
        for arm in self.arms.values():
            await self.saturation(arm)
        await self.collect_checks()


# --------------------------------------------------------------------------------------- tiny http


async def http_get_json(port: int, path: str) -> dict[str, object]:
    try:
        return json.loads(await http_get(port, path))
    except (OSError, ValueError, asyncio.TimeoutError) as exc:
        return {"error": repr(exc)}


async def http_get_text(port: int, path: str) -> str:
    try:
        return (await http_get(port, path)).decode(errors="replace")
    except (OSError, asyncio.TimeoutError):
        return ""


# --------------------------------------------------------------------------------------- report


def fit_cpu(batches: list[list[int]]) -> tuple[float, float]:
    """Least squares cpu = a*requests + b*events: fixed µs per request, marginal µs per event."""
    srr = sre = see = src = sec = 0.0
    for req, ev, cpu in batches:
        srr += req * req
        sre += req * ev
        see += ev * ev
        src += req * cpu
        sec += ev * cpu
    det = srr * see - sre * sre
    if det <= 0:
        return math.nan, math.nan
    a = (src * see - sec * sre) / det
    b = (sec * srr - src * sre) / det
    return a / 1e3, b / 1e3


def reduce(bench: Bench) -> dict[str, object]:
    rows = []
    pooled: dict[tuple[str, int], dict[str, array]] = {}
    lags: dict[tuple[str, int, int], list[int]] = {}  # proxy first-token stamp - upstream write, ns
    for (arm, conc, tokens), c in bench.cells.items():
        p = pooled.setdefault((arm, conc), {"ttft": array("q"), "gaps": array("q"), "lag": array("q")})
        p["ttft"].extend(c.ttft)
        p["gaps"].extend(c.gaps)
        if c.upstream_first:
            stamps = bench.arms[arm].first_tokens
            lags[(arm, conc, tokens)] = [v for b in c.upstream_first for v in first_token_lags(b, stamps)]
            p["lag"].extend(lags[(arm, conc, tokens)])
            p.setdefault("lag_expected", array("q")).append(sum(map(len, c.upstream_first)))
            for b in c.upstream_first:
                spread = batch_spread(b, stamps)
                if spread is not None:
                    p.setdefault("write_spread", array("q")).append(spread[0])
                    p.setdefault("stamp_spread", array("q")).append(spread[1])
    for (arm, conc, tokens), c in sorted(
        bench.cells.items(), key=lambda kv: (ARM_ORDER.index(kv[0][0]), kv[0][1], kv[0][2])
    ):
        d = bench.cells.get(("direct", conc, tokens))
        cpu = sum(b[2] for b in c.batches)
        reqs = sum(b[0] for b in c.batches)
        row = {
            "arm": arm,
            "concurrency": conc,
            "tokens": tokens,
            "streams": c.streams,
            "ok": c.ok,
            "byte_exact": c.exact,
            "errors": dict(c.errors),
            "ttft_p50_ms": pct(c.ttft, 0.5) / MS,
            "ttft_p99_ms": pct(c.ttft, 0.99) / MS,
            "ttfb_p50_ms": pct(c.ttfb, 0.5) / MS,
            "ttft_top5_ms": [round(v / MS, 3) for v in sorted(c.ttft)[-5:]],
            "gap_p50_ms": pct(c.gaps, 0.5) / MS,
            "gap_p99_ms": pct(c.gaps, 0.99) / MS,
            "gap_max_ms": c.max_gap / MS,
            "cpu_us_per_event": (cpu / c.events / 1e3) if (c.events and arm != "direct") else None,
            "cpu_us_per_request": (cpu / reqs / 1e3) if (reqs and arm != "direct") else None,
        }
        if d is not None and d.ttft and c.ttft:
            row["added_ttft_p50_ms"] = row["ttft_p50_ms"] - pct(d.ttft, 0.5) / MS
            row["added_ttft_p99_ms"] = row["ttft_p99_ms"] - pct(d.ttft, 0.99) / MS
            row["added_gap_p99_ms"] = row["gap_p99_ms"] - pct(d.gaps, 0.99) / MS if d.gaps and c.gaps else None
        if (arm, conc, tokens) in lags:
            row["first_token_lag"] = lag_summary(lags[(arm, conc, tokens)], sum(map(len, c.upstream_first)))
        rows.append(row)

    by_conc = []
    for (arm, conc), p in sorted(pooled.items(), key=lambda kv: (ARM_ORDER.index(kv[0][0]), kv[0][1])):
        d = pooled.get(("direct", conc))
        entry = {
            "arm": arm,
            "concurrency": conc,
            "samples": len(p["ttft"]),
            "ttft_p50_ms": pct(p["ttft"], 0.5) / MS,
            "ttft_p99_ms": pct(p["ttft"], 0.99) / MS,
            "gap_p99_ms": pct(p["gaps"], 0.99) / MS,
        }
        if d is not None:
            entry["added_ttft_p50_ms"] = entry["ttft_p50_ms"] - pct(d["ttft"], 0.5) / MS
            entry["added_ttft_p99_ms"] = entry["ttft_p99_ms"] - pct(d["ttft"], 0.99) / MS
            entry["added_gap_p99_ms"] = entry["gap_p99_ms"] - pct(d["gaps"], 0.99) / MS
        if "lag_expected" in p:
            entry["first_token_lag"] = lag_summary(p["lag"], sum(p["lag_expected"]))
            if "write_spread" in p:  # batches of 2 or more: first-token writes vs stamps, first to last
                entry["first_token_lag"]["write_spread_p50_ms"] = pct(p["write_spread"], 0.5) / MS
                entry["first_token_lag"]["stamp_spread_p50_ms"] = pct(p["stamp_spread"], 0.5) / MS
        own = bench.overhead.get((arm, conc))
        if own and own[1] and own[3]:
            # What the proxy says it cost a first token: its request stage plus one relay.
            entry["own_request_mean_ms"] = own[0] / own[1] * 1e3
            entry["own_relay_mean_ms"] = own[2] / own[3] * 1e3
            entry["own_first_token_ms"] = entry["own_request_mean_ms"] + entry["own_relay_mean_ms"]
        by_conc.append(entry)

    arms = {}
    for name, arm in bench.arms.items():
        batches = [b for (a, _, _), c in bench.cells.items() if a == name for b in c.batches]
        info: dict[str, object] = {"rss_kib": dict(arm.rss)}
        if arm.proc is not None and batches:
            per_req, per_ev = fit_cpu(batches)
            info["cpu_fit_us_per_request"] = per_req
            info["cpu_fit_us_per_event"] = per_ev
            rounds = [v for k, v in arm.rss.items() if k.startswith("after_round_")]
            if rounds:
                info["rss_growth_kib_first_to_last_round"] = rounds[-1] - rounds[0]
                info["rss_after_load_kib"] = rounds[-1]
        if name in bench.hold:
            info["hold"] = bench.hold[name]
        arms[name] = info

    mirroring = []  # taotrace-mirror against taotrace: the same code, mirroring on and off
    pooled_by = {(e["arm"], e["concurrency"]): e for e in by_conc}
    for (arm, conc), on in sorted(pooled_by.items()):
        off = pooled_by.get(("taotrace", conc))
        if arm != "taotrace-mirror" or off is None:
            continue
        entry = {"concurrency": conc, "samples_on": on["samples"], "samples_off": off["samples"]}
        for key in ("added_ttft_p50_ms", "added_ttft_p99_ms", "ttft_p50_ms", "ttft_p99_ms"):
            a, b = on.get(key), off.get(key)
            entry[f"{key}_on_minus_off"] = None if a is None or b is None else a - b
        mirroring.append(entry)
    if mirroring:
        on_cpu = arms.get("taotrace-mirror", {}).get("cpu_fit_us_per_request")
        off_cpu = arms.get("taotrace", {}).get("cpu_fit_us_per_request")
        mirroring.append(
            {
                "copies": bench.checks.get("mirror_copies_total"),
                "dropped": bench.checks.get("mirror_dropped_total"),
                "client_requests": bench.checks.get("taotrace-mirror_requests_total"),
                "cpu_fit_us_per_request_on_minus_off": None if on_cpu is None or off_cpu is None else on_cpu - off_cpu,
            }
        )

    sink = bench.checks.get("otlp_sink") or {}
    exporting = [n for n in bench.arms if n.startswith("taotrace") and n != "taotrace-noexport"]
    spans = {n: sink.get(f"spans:taotrace-bench-{n}", 0) for n in exporting}  # type: ignore[union-attr]
    return {
        "rows": rows,
        "by_concurrency": by_conc,
        "arms": arms,
        "throughput": bench.throughput,
        "otlp_spans": spans,
        "mirroring": mirroring,
    }


def targets(result: dict[str, object], plan: Plan) -> list[dict[str, object]]:
    """The issue's targets, judged on the telemetry-on arm."""
    out: list[dict[str, object]] = []
    bc = {(e["arm"], e["concurrency"]): e for e in result["by_concurrency"]}  # type: ignore[index]
    arms = result["arms"]  # type: ignore[assignment]
    tt = "taotrace"

    def add(name: str, value: float | None, limit: str, ok: bool | None) -> None:
        if isinstance(value, float) and math.isnan(value):
            ok = None  # not measured (e.g. a CPU fit over one stream length): n/a, not a miss
        out.append({"target": name, "value": value, "limit": limit, "met": ok})

    for conc, lim in ((1, 1.0), (32, 8.0)):
        e = bc.get((tt, conc))
        v = e.get("added_ttft_p99_ms") if e else None
        add(f"added TTFT p99 @ {conc} stream(s)", v, f"<= {lim} ms", None if v is None else v <= lim)
    e = bc.get((tt, 1), {})
    own, added = e.get("own_first_token_ms"), e.get("added_ttft_p50_ms")
    v = None if own is None or added is None else abs(added - own)
    add("|added TTFT p50 - own overhead histogram| @ 1 stream", v, "<= 1 ms", None if v is None else v <= 1.0)
    a = arms.get(tt, {})
    v = a.get("cpu_fit_us_per_event")
    add("CPU per forwarded event (marginal)", v, "<= 30 us", None if v is None else v <= 30)
    h = a.get("hold", {})
    v = h.get("kib_per_stream")
    add(f"RSS per idle open stream ({plan.hold} held)", v, "<= 48 KiB", None if v is None else v <= 48)
    v = a.get("rss_growth_kib_first_to_last_round")
    add("RSS growth round 1 -> last (leak)", v, "~0 (< 2 MiB)", None if v is None or plan.rounds < 2 else v < 2048)
    worst = None
    for e in result["by_concurrency"]:  # type: ignore[union-attr]
        if e["arm"] == tt and e.get("added_gap_p99_ms") is not None:
            worst = e["added_gap_p99_ms"] if worst is None else max(worst, e["added_gap_p99_ms"])
    add("added inter-chunk gap p99 (worst concurrency)", worst, "<= 1 ms", None if worst is None else worst <= 1.0)
    for conc in (1, 32):
        t, l = bc.get((tt, conc)), bc.get(("litellm", conc))
        if t and l and t.get("added_ttft_p50_ms") is not None and l.get("added_ttft_p50_ms") is not None:
            ratio = max(l["added_ttft_p50_ms"], 0.01) / max(t["added_ttft_p50_ms"], 0.01)
            add(f"LiteLLM / taotrace added TTFT p50 @ {conc}", ratio, ">= 10x", ratio >= 10)
        else:
            add(f"LiteLLM / taotrace added TTFT p50 @ {conc}", None, ">= 10x", None)
    ok = h.get("completed_ok")
    add(
        f"{plan.hold} concurrent open streams, no errors",
        ok,
        f"== {plan.hold}",
        None if ok is None else ok == plan.hold and not h.get("errors"),
    )
    # issue 15: taotrace --workers 2 on the 2-core machine
    w2 = "taotrace-w2"
    e = bc.get((w2, 128))
    v = e.get("added_ttft_p99_ms") if e else None
    add("[w2] added TTFT p99 @ 128 streams", v, "<= 8 ms", None if v is None else v <= 8.0)
    one = bc.get((tt, 128), {}).get("added_ttft_p99_ms")
    ratio = None if v is None or one is None else v - one
    add(
        "[w2] added TTFT p99 @ 128 streams, minus one process's",
        ratio,
        "<= 0 ms",
        None if ratio is None else ratio <= 0,
    )
    a2 = arms.get(w2, {})
    v = a2.get("cpu_fit_us_per_event")
    add("[w2] CPU per forwarded event (marginal)", v, "<= 20 us", None if v is None else v <= 20)
    base = a.get("cpu_fit_us_per_event")
    ratio = None if v is None or not base else v / base
    add("[w2] whole tree's CPU per event / one process's", ratio, "<= 1.05", None if ratio is None else ratio <= 1.05)
    cells = [r for r in result["rows"] if r["arm"] == w2 and r["concurrency"] == 1000]  # type: ignore[union-attr,index]
    if cells:
        streams = sum(r["streams"] for r in cells)
        exact = sum(r["byte_exact"] for r in cells)
        add("[w2] 1,000 streams started together, byte-exact", exact, f"== {streams}", exact == streams)
    else:
        add("[w2] 1,000 streams started together, byte-exact", None, "all", None)
    v = a2.get("hold", {}).get("kib_per_stream")
    add(f"[w2] RSS per idle open stream ({plan.hold} held)", v, "<= 24 KiB", None if v is None else v <= 24)
    # issue 15, telemetry off the serving thread's back: the proxy's first-token stamp against the
    # upstream's own write, and what exporting spans adds to the one-stream tail
    for arm, tag in (("taotrace", ""), ("taotrace-w2", "[w2] ")):
        for conc in (1, 32):
            lag = bc.get((arm, conc), {}).get("first_token_lag") or {}
            for q in ("p95", "p99"):
                v = lag.get(f"{q}_ms")
                add(
                    f"{tag}first token stamped after the upstream's write, {q} @ {conc}",
                    v,
                    "<= 1 ms",
                    None if v is None else v <= 1.0,
                )
    # "within 0.2 ms of export off": a distance. Export on far below off is the host's noise, not a pass.
    off = bc.get(("taotrace-noexport", 1), {})
    for arm, tag in ((tt, ""),):
        on = bc.get((arm, 1), {})
        a, b = on.get("added_ttft_p99_ms"), off.get("added_ttft_p99_ms")
        v = None if a is None or b is None else a - b
        add(
            f"{tag}added TTFT p99 @ 1 stream, export on - export off (n {on.get('samples', 0)} / {off.get('samples', 0)})",
            v,
            "within +-0.2 ms",
            None if v is None else abs(v) <= 0.2,
        )
    # --mirror never delays the client: the same code with every request copied, against none.
    on, off = bc.get(("taotrace-mirror", 1), {}), bc.get((tt, 1), {})
    a, b = on.get("added_ttft_p50_ms"), off.get("added_ttft_p50_ms")
    v = None if a is None or b is None else a - b
    add(
        f"added TTFT p50 @ 1 stream, mirroring on - off (n {on.get('samples', 0)} / {off.get('samples', 0)})",
        v,
        "within +-0.2 ms",
        None if v is None else abs(v) <= 0.2,
    )
    for arm, spans in result.get("otlp_spans", {}).items():  # type: ignore[union-attr]
        add(f"spans of {arm} received by the OTLP sink (export on is live)", spans, "> 0", spans > 0)
    return out


def fmt(v: object, nd: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def print_table(result: dict[str, object], meta: dict[str, object]) -> None:
    cols = [
        "arm",
        "conc",
        "tok",
        "n",
        "TTFT p50",
        "p99",
        "+TTFT p50",
        "+p99",
        "gap p99",
        "+gap p99",
        "max gap",
        "CPU us/ev",
        "us/req",
        "ok",
        "exact",
        "err",
    ]
    lines = []
    for r in result["rows"]:  # type: ignore[union-attr]
        lines.append(
            [
                r["arm"],
                str(r["concurrency"]),
                str(r["tokens"]),
                str(r["streams"]),
                fmt(r["ttft_p50_ms"]),
                fmt(r["ttft_p99_ms"]),
                fmt(r.get("added_ttft_p50_ms")),
                fmt(r.get("added_ttft_p99_ms")),
                fmt(r["gap_p99_ms"]),
                fmt(r.get("added_gap_p99_ms")),
                fmt(r["gap_max_ms"]),
                fmt(r["cpu_us_per_event"], 1),
                fmt(r["cpu_us_per_request"], 0),
                f"{r['ok']}/{r['streams']}",
                str(r["byte_exact"]),
                str(sum(r["errors"].values())),
            ]
        )
    widths = [max(len(c), *(len(l[i]) for l in lines)) if lines else len(c) for i, c in enumerate(cols)]
    print()
    print(f"taotrace overhead benchmark - {meta['machine']} - times in ms, CPU of the proxy process tree")
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=False)))
    for l in lines:
        print("  ".join(v.rjust(w) for v, w in zip(l, widths, strict=False)))
    print()
    print("per arm: CPU fit (fixed us/request + marginal us/event), memory (KiB)")
    for name, a in result["arms"].items():  # type: ignore[union-attr]
        h = a.get("hold", {})
        print(
            f"  {name:18} cpu {fmt(a.get('cpu_fit_us_per_request'), 0):>6} us/req + {fmt(a.get('cpu_fit_us_per_event'), 1):>6} us/event"
            f"   rss warm {fmt(a['rss_kib'].get('after_warmup'))} after-load {fmt(a.get('rss_after_load_kib'))}"
            f" growth {fmt(a.get('rss_growth_kib_first_to_last_round'))}"
            f"   hold {h.get('opened', '-')}/{h.get('streams', '-')} open, {h.get('completed_ok', '-')} ok,"
            f" {fmt(h.get('kib_per_stream'), 1)} KiB/stream, rss after {fmt(h.get('rss_after_kib'))}"
        )
    print()
    print("added TTFT by concurrency (all stream lengths pooled), ms:")
    for e in result["by_concurrency"]:  # type: ignore[union-attr]
        if e["arm"] != "direct":
            print(
                f"  {e['arm']:18} conc {e['concurrency']:>4}  n {e['samples']:>5}  +p50 {fmt(e.get('added_ttft_p50_ms')):>7}"
                f"  +p99 {fmt(e.get('added_ttft_p99_ms')):>7}  +gap p99 {fmt(e.get('added_gap_p99_ms')):>6}"
                f"  own {fmt(e.get('own_first_token_ms'), 3):>6}"
            )
    print("  (own: the arm's taotrace_proxy_overhead_seconds, mean request stage + mean relay per read)")
    lagged = [e for e in result["by_concurrency"] if e.get("first_token_lag")]  # type: ignore[union-attr]
    if lagged:
        print()
        print(
            "first token: the proxy's stamp minus the upstream's write of token 0 (ms; CLOCK_MONOTONIC, by trace id);"
        )
        print("  direct: the client's own arrival stamp instead, on the upstream's core (this host's floor):")
        for e in lagged:
            g = e["first_token_lag"]
            print(
                f"  {e['arm']:18} conc {e['concurrency']:>4}  matched {g['matched']:>5}/{g['expected']:<5}"
                f"  p50 {fmt(g['p50_ms'], 3):>6}  p95 {fmt(g['p95_ms'], 3):>6}  p99 {fmt(g['p99_ms'], 3):>6}"
                f"  max {fmt(g['max_ms'], 3):>6}"
                + (
                    f"   per batch, first to last: written in {fmt(g['write_spread_p50_ms'], 3)},"
                    f" stamped in {fmt(g['stamp_spread_p50_ms'], 3)} (p50)"
                    if "write_spread_p50_ms" in g
                    else ""
                )
            )
    mirroring = result.get("mirroring") or []
    if mirroring:
        print()
        print("mirroring: taotrace-mirror (every request copied to a second upstream) minus taotrace (no copies), ms:")
        for e in mirroring:  # type: ignore[union-attr]
            if "concurrency" in e:
                print(
                    f"  conc {e['concurrency']:>4}  n {e['samples_on']:>5} / {e['samples_off']:<5}"
                    f"  +TTFT p50 {fmt(e['added_ttft_p50_ms_on_minus_off'], 3):>7}"
                    f"  +TTFT p99 {fmt(e['added_ttft_p99_ms_on_minus_off'], 3):>7}"
                )
            else:
                print(
                    f"  copies {fmt(e['copies'], 0)} for {fmt(e['client_requests'], 0)} client requests,"
                    f" {fmt(e['dropped'], 0)} dropped by a cap;"
                    f" CPU fit per request, on - off: {fmt(e['cpu_fit_us_per_request_on_minus_off'], 0)} us"
                )
    if result.get("ratios"):
        print()
        print("ratios:")
        for k, v in result["ratios"].items():  # type: ignore[union-attr]
            print(f"  {k}: {fmt(v, 1)}")
    print()
    if result.get("throughput"):
        print()
        print(
            f"throughput at saturation: 16-token streams (1 ms apart), {SATURATION} started together, batch after batch:"
        )
        for name, t in result["throughput"].items():  # type: ignore[union-attr]
            print(
                f"  {name:18} {t['requests_per_s']:7.0f} req/s  ({t['byte_exact']}/{t['streams']} byte-exact, {t['cpu_cores']:.2f} cores)"
            )
        print("  (direct: what the client and upstream on core 0 can drive; an arm near it is client-bound)")
    print()
    print("targets (taotrace, telemetry on; [w2]: --workers 2):")
    for t in result["targets"]:  # type: ignore[union-attr]
        mark = {True: "MET ", False: "MISS", None: "n/a "}[t["met"]]
        print(f"  [{mark}] {t['target']}: {fmt(t['value'], 2)} (target {t['limit']})")
    if meta.get("skipped"):
        print()
        for k, v in meta["skipped"].items():  # type: ignore[union-attr]
            print(f"  arm {k} skipped: {v}")


def ratios(result: dict[str, object]) -> dict[str, float]:
    """taotrace against its two neighbours: added TTFT (p50, p99) by concurrency, CPU per event.

    `taotrace - nginx` (ms) is what taotrace adds beyond the C floor; `litellm / taotrace` > 1 is
    how many times less than LiteLLM it adds. Added TTFT under 0.01 ms counts as 0.01 ms.
    """
    bc = {(e["arm"], e["concurrency"]): e for e in result["by_concurrency"]}  # type: ignore[index]
    out: dict[str, float] = {}
    concs = sorted({c for (_, c) in bc})
    for conc in concs:
        t = bc.get(("taotrace", conc))
        if t is None:
            continue
        for q in ("p50", "p99"):
            key = f"added_ttft_{q}_ms"
            tv = t.get(key)
            if tv is None:
                continue
            n = bc.get(("nginx", conc), {}).get(key)
            if n is not None:
                # nginx often adds ~0 (within noise): a difference says more than a ratio then.
                out[f"taotrace - nginx, added TTFT {q} @ {conc} (ms)"] = tv - n
            ll = bc.get(("litellm", conc), {}).get(key)
            if ll is not None:
                out[f"litellm / taotrace, added TTFT {q} @ {conc}"] = max(ll, 0.01) / max(tv, 0.01)
    for conc in concs:  # two workers each: taotrace --workers 2 against nginx worker_processes 2
        t, n = bc.get(("taotrace-w2", conc)), bc.get(("nginx-w2", conc))
        for q in ("p50", "p99"):
            key = f"added_ttft_{q}_ms"
            if t and n and t.get(key) is not None and n.get(key) is not None:
                out[f"taotrace-w2 - nginx-w2, added TTFT {q} @ {conc} (ms)"] = t[key] - n[key]
    tp = result.get("throughput", {})
    for one, two in (("taotrace", "taotrace-w2"), ("nginx", "nginx-w2")):
        a, b = tp.get(one, {}).get("requests_per_s"), tp.get(two, {}).get("requests_per_s")  # type: ignore[union-attr]
        if a and b:
            out[f"scaling 1 -> 2 workers, {one} (req/s ratio)"] = b / a
    for name in ("taotrace", "taotrace-w2"):
        n = "nginx-w2" if name.endswith("w2") else "nginx"
        a, b = tp.get(name, {}).get("requests_per_s"), tp.get(n, {}).get("requests_per_s")  # type: ignore[union-attr]
        if a and b:
            out[f"throughput {name} / {n}"] = a / b
    arms = result["arms"]  # type: ignore[assignment]
    tcpu = arms.get("taotrace", {}).get("cpu_fit_us_per_event")
    for other in ("nginx", "litellm"):
        ocpu = arms.get(other, {}).get("cpu_fit_us_per_event")
        if tcpu and ocpu:
            out[f"CPU per event, taotrace / {other}"] = tcpu / ocpu
    return out


def machine() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} x {model}, {mem:.0f} GiB, Linux {platform.release()}, Python {platform.python_version()}"


def versions() -> dict[str, str]:
    out = {}
    try:
        out["taotrace_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        pass
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if Path(nginx).exists():
        out["nginx"] = subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr.strip()
    ll = HERE / ".litellm-venv" / "bin" / "python"
    if ll.exists():
        out["litellm"] = subprocess.run(
            [str(ll), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    import aiohttp

    out["aiohttp"] = aiohttp.__version__
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="~2 minutes: 16/256 tokens, 1 round, 300 held streams")
    ap.add_argument("--arms", default=",".join(ARM_ORDER), help="comma list from: " + ",".join(ARM_ORDER))
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], help="e.g. 1,8,32,128")
    ap.add_argument(
        "--lengths", type=lambda s: [int(x) for x in s.split(",")], help="tokens per stream, e.g. 16,256,1024"
    )
    ap.add_argument("--rounds", type=int, help="measured rounds (after the warm-up)")
    ap.add_argument("--samples", type=int, help="TTFT samples per cell per round at 16 tokens")
    ap.add_argument("--hold", type=int, help="idle streams held open for the memory test")
    ap.add_argument(
        "--saturation-seconds",
        type=float,
        help="per arm, 16-token streams 256 at a time (default 8; --quick 4; 0: skip)",
    )
    ap.add_argument("--ttft-ms", type=float, default=20.0, help="upstream time to first token")
    ap.add_argument("--interval-ms", type=float, default=5.0, help="upstream inter-token interval")
    ap.add_argument(
        "--baseline",
        metavar="GIT_REF|DIR",
        help="add an arm running proxy/ as of GIT_REF, or from DIR/proxy (telemetry on): "
        "A/B an optimisation in one run",
    )
    ap.add_argument(
        "--baseline-env",
        action="append",
        default=[],
        metavar="K=V",
        help="extra environment for the baseline arm (e.g. OTEL_TRACES_SAMPLER=always_off)",
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=-10 if os.geteuid() == 0 else 0,
        help="niceness of every bench process (default -10 as root: other work on the machine "
        "then delays our wake-ups less)",
    )
    ap.add_argument("--no-install", action="store_true", help="never install nginx or LiteLLM; skip those arms")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)

    wanted = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = set(wanted) - set(ARM_ORDER)
    if unknown:
        ap.error(f"unknown arms: {', '.join(sorted(unknown))}")
    if "direct" not in wanted:
        wanted.insert(0, "direct")  # every "added" figure is relative to it
    plan = make_plan(args)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    outdir = args.out / stamp
    outdir.mkdir(parents=True, exist_ok=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want_fds = min(hard, max(soft, 4 * plan.hold + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want_fds, hard))  # children inherit it
    if os.cpu_count() and os.cpu_count() >= 2:  # type: ignore[operator]
        os.sched_setaffinity(0, {int(LOAD_CPU)})
    if args.nice:
        os.nice(args.nice)

    bench = Bench(args, plan, outdir)
    started_with = versions()  # before the run: the tree may move while it runs
    t0 = time.monotonic()
    try:
        bench.start_all(wanted)
        bench.log("arms: " + ", ".join(bench.arms) + (f"; skipped: {bench.skipped}" if bench.skipped else ""))
        aio_run(bench.main())
    finally:
        bench.stop_all()
    result = reduce(bench)
    result["ratios"] = ratios(result)
    result["targets"] = targets(result, plan)
    meta = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": started_with,
        "plan": plan.__dict__,
        "quick": args.quick,
        "pinning": {"proxy_cpu": PROXY_CPU, "load_cpu": LOAD_CPU, "nice": args.nice},
        "skipped": bench.skipped,
        "checks": bench.checks,
        "seconds": round(time.monotonic() - t0, 1),
    }
    result["meta"] = meta
    print_table(result, meta)
    text = json.dumps(result, indent=1, default=str)
    (outdir / "result.json").write_text(text)
    (args.out / "latest.json").write_text(text)
    print(f"\nJSON: {outdir / 'result.json'} (also {args.out / 'latest.json'}); {meta['seconds']:.0f}s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
