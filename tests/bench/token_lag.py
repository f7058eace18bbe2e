"""First and last token against the upstream's own write, per dialect: how late the proxy stamps them.

    python tests/bench/token_lag.py                      # direct, taotrace, taotrace-w2; 1 and 32 streams
    python tests/bench/token_lag.py --baseline main      # and the same two arms from a git ref, interleaved

The bench upstream (`upstream.py`) streams each of the four dialects (chat completions, legacy
completions, the Responses API, Anthropic messages) and keeps the CLOCK_MONOTONIC instant it wrote
each stream's first and last token, keyed by the trace id of the `traceparent` it was sent
(`/bench/first_tokens`, `/bench/last_tokens`). taotrace's live view gives its own instants per
trace id (`first_token_monotonic`, `last_token_monotonic` of `/api/requests`); the difference is
how late the proxy stamped the token. For `direct` the client sends the traceparent and its own
arrival stamps stand in: the floor of the measurement on this host.

Arms are interleaved batch by batch (after a discarded warm-up); a batch is C streams started
together on keep-alive connections. Placement as in `run.py`: the upstream, the OTLP sink and
this client on core 0, a single-process proxy on core 1, `--workers 2` on both; every process
at nice -10 when run as root. Results: a table
on stdout, JSON in tests/bench/results/token_lag-latest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import orjson  # noqa: E402
from client import Pool  # noqa: E402
from payload import APIS, PATHS, run, stream_parts  # noqa: E402
from procs import Proc, free_port, http_get, wait_port  # noqa: E402
from samples import first_token_lags, lag_summary, proxy_first_tokens  # noqa: E402

PY = sys.executable
LOAD_CPU, PROXY_CPU, BOTH_CPUS = "0", "1", "0,1"
MODEL = "bench-model"


def request_bytes(port: int, api: str, n_tokens: int, traceparent: str = "") -> bytes:
    """One streaming request of dialect `api`, as its SDK would send it."""
    prompt = "Count for me."
    body: dict[str, object]
    if api == "chat_completions":
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n_tokens}
        body["stream_options"] = {"include_usage": True}
    elif api == "completions":
        body = {"prompt": prompt, "max_tokens": n_tokens, "stream_options": {"include_usage": True}}
    elif api == "responses":
        body = {"input": prompt, "max_output_tokens": n_tokens}
    else:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n_tokens}
    raw = orjson.dumps({"model": MODEL, "stream": True, **body})
    extra = b"traceparent: %s\r\n" % traceparent.encode() if traceparent else b""
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer sk-bench-7f3a9c2e4b1d8f6a0e5c3b7d9a1f2e4c\r\naccept: text/event-stream\r\n"
        b"%scontent-length: %d\r\n\r\n%s" % (PATHS[api].encode(), port, extra, len(raw), raw)
    )


@dataclass
class Arm:
    """One way of reaching the upstream, and what it measured."""

    name: str
    port: int
    metrics_port: int = 0  # 0: direct (the client's own stamps)
    settle: float = 0.02  # before reading the live view: workers send records in batches
    pool: Pool = field(init=False)
    ui_seq: int = 0
    # (api, conc, first|last) -> trace id -> the upstream's write; matched with `own` at the end
    writes: dict[tuple[str, int, str], dict[str, float]] = field(default_factory=dict)
    own: dict[str, dict[str, float]] = field(default_factory=lambda: {"first": {}, "last": {}})  # the arm's stamps
    errors: int = 0

    def lags(self) -> dict[tuple[str, int, str], list[int]]:
        """Own stamp minus the upstream's write, ns, per (api, conc, first|last)."""
        return {key: first_token_lags(ups, self.own[key[2]]) for key, ups in self.writes.items()}

    def __post_init__(self) -> None:
        self.pool = Pool("127.0.0.1", self.port)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        self.procs: list[Proc] = []
        self.arms: list[Arm] = []
        self.upstream_port = 0

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def _start(self, proc: Proc, port: int) -> None:
        proc.nice = self.args.nice
        self.procs.append(proc.start())
        try:
            wait_port(port, 30.0, proc.popen)
        except Exception as exc:
            raise RuntimeError(f"{proc.name} did not start: {exc}\n{proc.tail()}") from exc

    def _export(self, ref: str) -> Path:
        """`proxy/` as of a git ref, unpacked beside the results (the repository is not touched)."""
        dest = self.out / f"baseline-{ref.replace('/', '_')}"
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", ref, "proxy"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return dest

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TAOTRACE_"))}
        self.upstream_port = free_port()
        argv = [PY, str(HERE / "upstream.py"), "--port", str(self.upstream_port)]
        argv += ["--ttft-ms", str(self.args.ttft_ms), "--interval-ms", str(self.args.interval_ms)]
        self._start(Proc("upstream", argv, self.out / "upstream.log", cpus=LOAD_CPU, env=env), self.upstream_port)
        sink = free_port()
        sink_argv = [PY, str(HERE / "otlp_sink.py"), "--port", str(sink)]
        self._start(Proc("otlp-sink", sink_argv, self.out / "otlp-sink.log", cpus=LOAD_CPU, env=env), sink)
        penv = dict(env)
        penv.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{sink}", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
        wanted = self.args.arms.split(",")
        if "direct" in wanted:
            self.arms.append(Arm("direct", self.upstream_port))
        sources = [("", ROOT)] + ([("-base", self._export(self.args.baseline))] if self.args.baseline else [])
        for suffix, src in sources:
            for name in ("taotrace", "taotrace-w2"):
                if name in wanted:
                    self._start_taotrace(name + suffix, penv, src, workers=name.endswith("w2"))

    def _start_taotrace(self, name: str, env: dict[str, str], src: Path, workers: bool) -> None:
        port, mport = free_port(), free_port()
        argv = [PY, "-m", "proxy", "serve", "--upstream", f"http://127.0.0.1:{self.upstream_port}"]
        argv += ["--port", str(port), "--metrics-port", str(mport)] + (["--workers", "2"] if workers else [])
        penv = dict(env, OTEL_SERVICE_NAME=f"taotrace-bench-{name}")
        cpus = BOTH_CPUS if workers else PROXY_CPU
        self._start(Proc(name, argv, self.out / f"{name}.log", cpus=cpus, env=penv, cwd=str(src)), port)
        self.arms.append(Arm(name, port, mport, settle=0.06 if workers else 0.02))

    def stop(self) -> None:
        for arm in self.arms:
            arm.pool.close()
        for proc in reversed(self.procs):
            proc.stop()

    async def _get(self, port: int, path: str) -> dict[str, object]:
        got = json.loads(await http_get(port, path))
        assert isinstance(got, dict)
        return got

    async def upstream_writes(self) -> tuple[dict[str, float], dict[str, float]]:
        """The upstream's first- and last-token write instants since the last call (it forgets them)."""
        first = await self._get(self.upstream_port, "/bench/first_tokens")
        last = await self._get(self.upstream_port, "/bench/last_tokens")
        return (
            {k: v for k, v in first.items() if isinstance(v, float)},
            {k: v for k, v in last.items() if isinstance(v, float)},
        )

    async def batch(self, arm: Arm, api: str, conc: int, record: bool) -> None:
        n = self.args.tokens
        conns, new = await arm.pool.acquire(conc)
        if new:
            await asyncio.sleep(0.01)  # the proxy accepts them before the clock starts
        direct = arm.metrics_port == 0
        tids = [os.urandom(16).hex() for _ in conns] if direct else []
        raws = (
            [request_bytes(arm.port, api, n, f"00-{t}-{'1' * 16}-01") for t in tids]
            if direct
            else [request_bytes(arm.port, api, n)] * conc
        )
        futs = [c.send(r) for c, r in zip(conns, raws, strict=True)]
        done, _ = await asyncio.wait(futs, timeout=30)
        arm.pool.release(conns)
        head, tokens, tail = stream_parts(api, MODEL, n)
        expected = b"".join((*head, *tokens, *tail))
        first_own, last_own = arm.own["first"], arm.own["last"]
        for i, f in enumerate(futs):
            resp = f.result() if f in done else None
            if resp is None or resp.status != 200 or resp.body != expected:
                arm.errors += record
                continue
            if direct:  # the arrival of the events that carry token 0 and token n-1
                first_own[tids[i]] = resp.event_times[len(head)] / 1e9
                last_own[tids[i]] = resp.event_times[len(head) + n - 1] / 1e9
        if not direct:
            await asyncio.sleep(arm.settle)  # the records reach the live view (a late one: at the next read)
            await self.read_rows(arm)
        up_first, up_last = await self.upstream_writes()
        if record:
            arm.writes.setdefault((api, conc, "first"), {}).update(up_first)
            arm.writes.setdefault((api, conc, "last"), {}).update(up_last)
        await asyncio.sleep(0.005)

    async def read_rows(self, arm: Arm) -> None:
        """The arm's live-view rows since the last read: its first- and last-token stamps."""
        got = await self._get(arm.metrics_port, f"/api/requests?limit=1000&since={arm.ui_seq}")
        rows, seq = got.get("requests"), got.get("last_seq")
        assert isinstance(rows, list) and isinstance(seq, int), got
        arm.ui_seq = seq
        arm.own["first"].update(proxy_first_tokens(rows))
        arm.own["last"].update(proxy_first_tokens(rows, "last_token_monotonic"))

    async def main(self) -> dict[str, object]:
        for arm in self.arms:  # the live view's cursor: rows from here on
            if arm.metrics_port:
                got = await self._get(arm.metrics_port, "/api/requests?limit=1")
                arm.ui_seq = int(got.get("last_seq") or 0)  # type: ignore[call-overload]
        for conc in self.args.concurrency:
            batches = max(1, self.args.streams // conc)
            for api in APIS:
                self.log(f"{api} x{conc}: {batches} batches per arm")
                for i in range(self.args.warmup + batches):
                    order = self.arms[i % len(self.arms) :] + self.arms[: i % len(self.arms)]
                    for arm in order:
                        await self.batch(arm, api, conc, record=i >= self.args.warmup)
        await asyncio.sleep(0.2)
        for arm in self.arms:
            if arm.metrics_port:
                await self.read_rows(arm)
        rows = []
        for arm in self.arms:
            for (api, conc, which), lags in sorted(arm.lags().items()):
                expected = self.args.streams // conc * conc
                rows.append({"arm": arm.name, "api": api, "conc": conc, "token": which, **lag_summary(lags, expected)})
        return {"rows": rows, "errors": {a.name: a.errors for a in self.arms}, "load": os.getloadavg()}


def print_table(result: dict[str, object]) -> None:
    def ms(v: object) -> str:
        return f"{v:7.3f}" if isinstance(v, float) else "      -"

    print(
        f"{'arm':16} {'api':17} {'conc':>4} {'token':5} {'n':>5} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'max ms':>7}"
    )
    for r in result["rows"]:  # type: ignore[attr-defined]
        print(
            f"{r['arm']:16} {r['api']:17} {r['conc']:>4} {r['token']:5} {r['matched']:>5} "
            f"{ms(r['p50_ms'])} {ms(r['p95_ms'])} {ms(r['p99_ms'])} {ms(r['max_ms'])}"
        )
    print(f"errors {result['errors']}  load average at the end {result['load']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default="direct,taotrace,taotrace-w2", help="from: direct,taotrace,taotrace-w2")
    ap.add_argument("--baseline", help="also run taotrace(-w2) from this git ref, as <arm>-base")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    ap.add_argument("--streams", type=int, default=320, help="measured streams per (arm, dialect, concurrency)")
    ap.add_argument("--warmup", type=int, default=2, help="discarded batches per (dialect, concurrency)")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "token_lag")
    ap.add_argument(
        "--nice",
        type=int,
        default=-10 if os.geteuid() == 0 else 0,
        help="niceness of every bench process, as run.py's (other work on the machine delays our wake-ups less)",
    )
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {int(LOAD_CPU)})  # this client beside the upstream, off the proxy's core
    if args.nice:
        os.nice(args.nice)
    bench = Bench(args)
    result: dict[str, object] = {}

    async def go() -> None:
        result.update(await bench.main())

    try:
        bench.start()
        run(go())
    finally:
        bench.stop()
    print_table(result)
    (args.out / "token_lag-latest.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
