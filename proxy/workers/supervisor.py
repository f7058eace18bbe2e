"""`taotrace serve --workers N`: N serving processes on one port, one supervisor for the group.

    supervisor: /metrics /healthz /readyz, the live view, spans and OTLP metrics, from every worker's records
      │   one socketpair per worker: ("records", [RequestRecord...], {api: in flight}) ──┐
      ├── worker 0  `python -m proxy.workers.worker`: the proxy on :PORT (SO_REUSEPORT) ─┤
      └── worker 1  ...                                                                  ┘

The supervisor binds the proxy port first, with SO_REUSEPORT and without listening: that
resolves port 0, fails early when the port is taken, and holds the port across worker
restarts. Each worker binds the same port with SO_REUSEPORT and the kernel spreads new
connections over the listening workers (Linux). Serving loops never render exposition text:
the supervisor aggregates (counters and histograms by applying every record once; in-flight
gauges as the sum of each worker's last count) and renders.

Serving loops never build or encode spans either: a worker starts each request's root span
(ids, sampling, `traceparent` upstream) and ships its start in the record (`RequestRecord.span`);
the supervisor finishes it with the same ids, adds the phase children and exports them, under a
resource with that worker's `service.instance.id` (`Telemetry.replay`). The OTLP GenAI metrics
are recorded and exported here too, once for the group. So the GIL a serving loop shares is
never held by span building, OTLP encoding or metric export (`--telemetry-process` runs one
worker this way).

A worker that dies is logged and started again (`taotrace_worker_restarts_total`); the other
workers' streams are untouched, the dead one's connections are cut by the kernel. SIGTERM or
SIGINT: /readyz turns 503 and every worker drains within `--drain-seconds`; a second signal
cuts them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from proxy.app import create_metrics_app
from proxy.inflight import InFlight
from proxy.lifecycle import Shutdown
from proxy.listen import bind
from proxy.protocol import GuardedAppRunner
from proxy.record import RequestRecord
from proxy.serve import (
    HURRIED_SHUTDOWN_SECONDS,
    TRACE_SHUTDOWN_SECONDS,
    announce,
    genai_metrics_for,
    metrics_for,
    telemetry_for,
)
from proxy.settings import Settings
from proxy.telemetry import sdk_internals
from proxy.telemetry.collector_log import collector_warnings
from proxy.telemetry.genai_metrics import build_meter_provider, shutdown_meter_provider
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.spans import Telemetry, build_tracer_provider, shutdown_tracer_provider
from proxy.ui import LiveView
from proxy.workers.channel import encode, receive

__all__ = ["Group", "instance_id", "serve_group", "supervising"]

log = logging.getLogger("taotrace")
KILL_GRACE = 10.0  # seconds past drain_seconds (+ span flush) before a worker that will not exit is killed
CRASH_WINDOW = 2.0  # a worker that dies sooner than this after starting is restarted with a growing delay
MAX_BACKOFF = 10.0
ASK_TIMEOUT = 0.5  # seconds the live view waits for a worker to say what it has in flight


def instance_id(index: int, base: Mapping[str, str]) -> str:
    """Worker `index`'s `service.instance.id`: a given one with `-index` appended, else a new uuid."""
    attrs = [a for a in base.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",") if a.strip()]
    given = next((a.split("=", 1)[1] for a in attrs if a.split("=", 1)[0].strip() == "service.instance.id"), None)
    return f"{given.strip()}-{index}" if given else str(uuid.uuid4())


@dataclass
class _Worker:
    """One slot of the group and the process in it now."""

    index: int
    resource: Resource | None = None  # its spans' resource: the group's, with its own service.instance.id
    proc: asyncio.subprocess.Process | None = None
    ready: bool = False
    in_flight: dict[tuple[str, ...], float] = field(default_factory=dict)  # (upstream, api) -> requests
    started: float = 0.0
    writer: asyncio.StreamWriter | None = None  # to the process in the slot now
    asks: dict[int, asyncio.Future[list[InFlight]]] = field(default_factory=dict)  # the live view's questions


@dataclass
class Group:
    """A running group: where it listens, what it records to, how to stop it."""

    proxy_url: str
    metrics_url: str
    metrics: Metrics
    workers: list[_Worker]
    metrics_addresses: tuple[str, ...] = ()  # what the metrics port is bound to (is the live view exposed?)
    draining: bool = False
    stopping: bool = False
    hurried: bool = False  # a second signal: the last span flush gets less time too

    def readiness(self) -> str:
        if self.draining:
            return "draining"
        if all(w.ready for w in self.workers):
            return "ready"
        return "starting"

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers if w.proc is not None and w.proc.returncode is None]

    def signal_all(self, sig: int = signal.SIGTERM) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(sig)

    def cut(self) -> None:
        """A second stop signal: every worker cuts its streams now."""
        self.hurried = True
        self.signal_all(signal.SIGTERM)


class _Supervisor:
    def __init__(
        self,
        settings: Settings,
        group: Group,
        observers: Sequence[Callable[[RequestRecord], None]],
        env: Mapping[str, str],
        command: Sequence[str],
        telemetry: Telemetry,
    ) -> None:
        self.settings = settings
        self.group = group
        self.observers = tuple(observers)
        self.telemetry = telemetry
        # Workers ship their spans' starts only when spans leave from here.
        self.ship_spans = bool(sdk_internals.span_processors(telemetry.tracer))
        self.env = env
        self.command = tuple(command)
        self._asked = 0

    def _apply(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "ready":
            worker.ready = True
            return
        if kind == "in_flight":
            asked = worker.asks.pop(message[1], None)
            if asked is not None and not asked.done():
                asked.set_result(message[2])
            return
        if kind != "records":
            return
        _, records, in_flight = message
        metrics, replay = self.group.metrics, self.telemetry.replay
        for rec in records:
            if rec.span is not None:
                try:
                    replay(rec, worker.resource)
                except Exception:  # telemetry never stops the group's metrics
                    log.exception("could not export a worker's request span")
                # Observers (the live view's ring) get what they get in one process.
                rec = dataclasses.replace(rec, span=None)
            try:
                metrics.record(rec)
                for observe in self.observers:
                    observe(rec)
            except Exception:  # one bad record must not stop the group's metrics
                log.exception("could not record a worker's request")
        if in_flight != worker.in_flight:
            worker.in_flight = in_flight
            self._sum_in_flight()

    async def running(self, want: str | None = None) -> list[InFlight]:
        """The live view's question to every worker: what is in flight now (with `want`, that
        request only). Asked when the page polls, never otherwise; a worker slower than
        `ASK_TIMEOUT` is left out of this answer."""
        only = None
        if want is not None and want.startswith("w") and "-live-" in want:  # a key of ours, not a trace id
            index, _, want = want[1:].partition("-")
            only = int(index) if index.isdigit() else -1
        loop = asyncio.get_running_loop()
        asked = []
        for w in self.group.workers:
            if w.writer is None or w.writer.is_closing() or not w.ready or only not in (None, w.index):
                continue
            self._asked += 1
            w.asks[self._asked] = future = loop.create_future()
            w.writer.write(encode(("in_flight?", self._asked, want)))
            asked.append((w, self._asked, future))
        if not asked:
            return []
        await asyncio.wait([future for _, _, future in asked], timeout=ASK_TIMEOUT)
        out: list[InFlight] = []
        for w, n, future in asked:
            w.asks.pop(n, None)
            if future.done() and not future.cancelled():
                # Trace ids are unique across the group; the keys of untraced requests get the worker's index.
                out.extend(
                    f if f.trace_id else dataclasses.replace(f, id=f"w{w.index}-{f.id}") for f in future.result()
                )
        out.sort(key=lambda f: f.started)
        return out

    def _sum_in_flight(self) -> None:
        gauge = self.group.metrics.in_flight
        totals = {key: 0.0 for key in list(gauge.children)}
        for w in self.group.workers:
            for key, n in w.in_flight.items():
                totals[key] = totals.get(key, 0.0) + n
        for key, n in totals.items():
            gauge.labels(*key).set(n)

    async def run_slot(self, worker: _Worker) -> None:
        """Start the slot's worker, apply what it sends, and start it again if it dies."""
        failures = 0
        while not self.group.stopping:
            parent, child = socket.socketpair()
            worker.started = time.monotonic()
            try:
                worker.proc = await asyncio.create_subprocess_exec(
                    *self.command, str(child.fileno()),
                    pass_fds=(child.fileno(),), start_new_session=True, stdin=asyncio.subprocess.DEVNULL,
                    env=dict(self.env),  # uvloop wants a dict, not os.environ
                )  # fmt: skip
            finally:
                child.close()
            if self.group.stopping:  # the group began stopping while this worker started: it missed the signal
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.send_signal(signal.SIGTERM)
            reader, writer = await asyncio.open_connection(sock=parent)
            worker.writer = writer
            writer.write(encode(("start", self.settings.model_dump(), worker.index, self.ship_spans)))
            try:
                while (message := await receive(reader)) is not None:
                    self._apply(worker, message)
            except Exception:  # a message we cannot read: restart that worker rather than lose its slot
                log.exception("worker %d sent a message the supervisor cannot read; restarting it", worker.index)
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.kill()
            returncode = await worker.proc.wait()
            writer.close()
            worker.writer = None
            for asked in worker.asks.values():
                asked.cancel()
            worker.asks.clear()
            worker.ready = False
            worker.in_flight = {}
            self._sum_in_flight()
            if self.group.stopping:
                return
            how = f"signal {-returncode}" if returncode < 0 else f"status {returncode}"
            self.group.metrics.worker_restarts.labels().inc()
            failures = failures + 1 if time.monotonic() - worker.started < CRASH_WINDOW else 0
            delay = min(MAX_BACKOFF, 0.5 * 2 ** (failures - 1)) if failures else 0.0
            log.warning("worker %d (pid %d) exited with %s; restarting it%s", worker.index, worker.proc.pid, how,
                        f" in {delay:g}s" if delay else "")  # fmt: skip
            await asyncio.sleep(delay)


@contextlib.asynccontextmanager
async def supervising(
    settings: Settings,
    *,
    on_record: Callable[[RequestRecord], None] | None = None,
    registry: CollectorRegistry | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 60.0,
    worker_command: Sequence[str] = (sys.executable, "-m", "proxy.workers.worker"),
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    shutdown: Shutdown | None = None,
) -> AsyncIterator[Group]:
    """Start `settings.workers` workers and the group's metrics port; drain them all on exit.

    Yields once every worker is serving (or `ready_timeout` passed: /readyz then says so).
    `worker_command` runs one worker (its socket's fd is appended); benchmarks wrap it.
    `tracer_provider` / `meter_provider`: where the group's spans and OTLP metrics go (by
    default, built from `env`'s `OTEL_*`); one passed in is not shut down.
    `shutdown`: the signals, heard from the start: a first one ends the wait for the workers
    (a worker that never gets ready must not make Ctrl-C wait for `ready_timeout`), a second
    cuts the drain at once."""
    env = os.environ if env is None else env
    # Both ports before anything else, as uvicorn's parent binds before its workers start: one
    # that cannot be had is one line and an exit, with no worker started and none to wait for.
    reserved = bind(  # the proxy port, bound without listening: resolves port 0, held across restarts
        settings.host, settings.port, port_flag="--port", host_flag="--host", backlog=None, reuse_port=True,
        exclusive=True,
    )  # fmt: skip
    metrics_socks: list[socket.socket] = []
    try:
        metrics_socks = bind(
            settings.metrics_host, settings.metrics_port, port_flag="--metrics-port", host_flag="--metrics-host"
        )
        async with _supervised(
            settings, reserved[0].getsockname()[:2], metrics_socks, on_record=on_record, registry=registry, env=env,
            ready_timeout=ready_timeout, worker_command=worker_command, tracer_provider=tracer_provider,
            meter_provider=meter_provider, shutdown=shutdown,
        ) as group:  # fmt: skip
            yield group
    finally:
        for sock in reserved + metrics_socks:
            sock.close()


@contextlib.asynccontextmanager
async def _supervised(
    settings: Settings,
    address: tuple[str, int],
    metrics_socks: Sequence[socket.socket],
    *,
    on_record: Callable[[RequestRecord], None] | None,
    registry: CollectorRegistry | None,
    env: Mapping[str, str],
    ready_timeout: float,
    worker_command: Sequence[str],
    tracer_provider: trace.TracerProvider | None,
    meter_provider: MeterProvider | None,
    shutdown: Shutdown | None,
) -> AsyncIterator[Group]:
    """`supervising`, with the proxy port held at `address` and the metrics port bound."""
    host, port = address
    # One salt of taotrace.key.id for the group: workers drawing their own would give a key one id per worker.
    salt = settings.key_salt if settings.key_salt is not None else SecretStr(secrets.token_hex(32))
    worker_settings = settings.model_copy(update={"port": port, "key_salt": salt})
    metrics = metrics_for(settings, registry)
    provider = build_tracer_provider(env) if tracer_provider is None else tracer_provider
    meters = build_meter_provider(env) if meter_provider is None else meter_provider
    telemetry = telemetry_for(settings, provider, env=env)  # replay() only: the workers start spans and sample
    base = getattr(telemetry.tracer, "resource", None)
    workers = []
    for i in range(settings.workers):
        instance = Resource({"service.instance.id": instance_id(i, env)})
        workers.append(_Worker(i, base.merge(instance) if isinstance(base, Resource) else None))
    host_part = f"[{host}]" if ":" in host else host
    group = Group(f"http://{host_part}:{port}", "", metrics, workers)
    observers: list[Callable[[RequestRecord], None]] = [] if on_record is None else [on_record]
    genai = None
    if meters is not None:  # the group's OTLP metrics, recorded and exported here, off the serving loops
        genai = genai_metrics_for(settings, meters, metrics.models, env)
        observers.append(genai)
    live = None
    if settings.ui:  # the group's live view, fed every worker's records
        live = LiveView(
            settings.ui_requests,
            in_flight=lambda: int(sum(n for w in group.workers for n in w.in_flight.values())),
            capture_content=settings.capture_content,
        )
        observers.append(live.observe)
    supervisor = _Supervisor(worker_settings, group, observers, env, worker_command, telemetry)
    if live is not None:
        live.active = supervisor.running  # what runs now, asked of the workers when the page polls
    token = settings.ui_token.get_secret_value() if settings.ui_token is not None else None
    runner = GuardedAppRunner(
        create_metrics_app(
            metrics.registry.render, group.readiness, live, ui_token=token, trace_url=settings.trace_url
        ),
        access_log=None,
        shutdown_timeout=1.0,
    )
    await runner.setup()
    slots: list[asyncio.Future[None]] = []
    # The exporters' own warnings become rate-limited lines of ours, until the last flush at exit.
    exporting = tracer_provider is None or meter_provider is None
    async with collector_warnings(env if exporting else {}, log):
        try:
            for sock in metrics_socks:
                await web.SockSite(runner, sock).start()
            mhost, mport = runner.addresses[0][:2]
            group.metrics_url = f"http://[{mhost}]:{mport}" if ":" in mhost else f"http://{mhost}:{mport}"
            group.metrics_addresses = tuple(str(a[0]) for a in runner.addresses)
            slots += [asyncio.ensure_future(supervisor.run_slot(w)) for w in group.workers]
            deadline = time.monotonic() + ready_timeout
            while group.readiness() != "ready" and time.monotonic() < deadline:
                if all(s.done() for s in slots) or (shutdown is not None and shutdown.requested.is_set()):
                    break
                await asyncio.sleep(0.02)
            yield group
        finally:
            group.draining = group.stopping = True
            group.signal_all(signal.SIGTERM)
            cutter = asyncio.ensure_future(_cut_on(shutdown.now, group)) if shutdown is not None else None
            limit = settings.drain_seconds + KILL_GRACE
            done, pending = await asyncio.wait(slots, timeout=limit) if slots else (set(), set())
            if pending:
                log.error("workers still running %.0fs after SIGTERM: killing them", limit)
                group.signal_all(signal.SIGKILL)
                await asyncio.wait(pending, timeout=5.0)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    log.error("worker slot failed", exc_info=task.exception())
            if cutter is not None:
                cutter.cancel()
            await runner.cleanup()
            wait = HURRIED_SHUTDOWN_SECONDS if group.hurried else TRACE_SHUTDOWN_SECONDS
            if genai is not None:
                await asyncio.to_thread(genai.stop, wait)  # what is queued gets recorded
            flushes = []  # both exports at once: exit stays within drain_seconds + ~2 s
            if meter_provider is None and meters is not None:
                flushes.append(asyncio.to_thread(shutdown_meter_provider, meters, wait))
            if tracer_provider is None:
                flushes.append(asyncio.to_thread(shutdown_tracer_provider, provider, wait))
            await asyncio.gather(*flushes)


async def serve_group(settings: Settings) -> None:
    """`taotrace serve --workers N`: run the group until SIGTERM or SIGINT, then drain it."""
    shutdown = Shutdown().install()
    async with supervising(settings, shutdown=shutdown) as group:
        workers = f"{settings.workers} workers" if settings.workers > 1 else "1 worker"
        if not shutdown.requested.is_set():  # a Ctrl-C while the workers started: straight to the drain
            pids = " ".join(map(str, group.pids()))
            processes = f"({workers}, pids {pids}; spans, /metrics and the live view in pid {os.getpid()})"
            announce(
                settings, group.proxy_url, group.metrics_url, group.metrics_addresses, ui=settings.ui,
                processes=processes,
            )  # fmt: skip
        await shutdown.wait()
        log.info("draining %s: up to %gs; a second Ctrl-C or SIGTERM cuts them now", workers, settings.drain_seconds)


async def _cut_on(now: asyncio.Event, group: Group) -> None:
    await now.wait()
    group.cut()
