"""`taotrace serve --workers N`: N serving processes on one port, one supervisor for the group.

    supervisor: /metrics /healthz /readyz, the live view, spans and OTLP metrics (`Reporting`)
      │   one socketpair per worker: Hello, Start, then Records(records, in flight, dropped, sink errors) ─┐
      ├── worker 0  `python -m proxy.workers.worker`: the proxy on :PORT (SO_REUSEPORT) ──────┤
      └── worker 1  ...                                                                       ┘

The supervisor binds the proxy port first, with SO_REUSEPORT and without listening: that
resolves port 0, fails early when the port is taken, and holds the port across worker
restarts. Each worker binds the same port with SO_REUSEPORT and the kernel spreads new
connections over the listening workers (Linux). Serving loops never render exposition text:
the supervisor aggregates (counters and histograms by applying every record once; in-flight
gauges as the sum of each worker's last count) and renders.

Serving loops never build or encode spans either: a worker starts each request's root span
(ids, sampling, `traceparent` upstream) and ships its start in the record (`RequestRecord.span`);
the supervisor finishes it with the same ids, adds the phase children and exports them, under a
resource with that worker's `service.instance.id` (`Spans.end`). The OTLP GenAI metrics
are recorded and exported here too, once for the group. So the GIL a serving loop shares is
never held by span building, OTLP encoding or metric export (`--telemetry-process` runs one
worker this way).

The channel (channel.py, messages.py): a worker says Hello with its version and is refused,
with a log line, unless it runs this supervisor's very code (an in-place upgrade restarts
workers from new code under the old supervisor); its messages are bounded in the worker
(`taotrace_records_dropped_total` counts what a lagging supervisor never got).

`--mirror` runs in the workers: each copies the requests it serves, within its share of the
group's caps (`worker_share`, sent in its `Start`), and reports the copies its caps refused with
its records; the copy's span link travels in its shipped span start like any other link.

A worker that dies is logged and started again (`taotrace_worker_restarts_total`); the other
workers' streams are untouched, the dead one's connections are cut by the kernel. Its requests
in flight, as its last report counted them, are counted as `error_type="worker_lost"`: the
in-flight counts ride on the messages that carry records, and are sent at least every 0.25 s
while they change, so no message per request start is added. SIGTERM or SIGINT: /readyz turns
503 and every worker drains within `--drain-seconds`; a second signal cuts them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry.util.types import AnyValue
from prometheus_client import CollectorRegistry

from proxy.config.config import Config, load
from proxy.config.settings import Settings
from proxy.exchange.inflight import InFlight
from proxy.exchange.mirror import worker_share
from proxy.exchange.observers import Named, Observers
from proxy.exchange.record import RequestRecord
from proxy.logs.ratelimited import RateLimitedLog
from proxy.reporting.reporting import Reporting
from proxy.server.lifecycle import Shutdown
from proxy.server.listen import bind, http_url
from proxy.telemetry.metric_pipeline import MetricPipeline
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.spandata import Resource
from proxy.telemetry.spans import Spans
from proxy.telemetry.tracing import Tracing
from proxy.workers.channel import ChannelError, encode, mismatch, receive, receive_hello
from proxy.workers.messages import (
    AskInFlight,
    InFlightAnswer,
    Ready,
    Records,
    Start,
    ToSupervisor,
    ToWorker,
)

__all__ = ["CHANNEL_BOUND", "Group", "instance_id", "supervising"]

log = logging.getLogger("taotrace")
KILL_GRACE = 10.0  # seconds past drain_seconds (+ span flush) before a worker that will not exit is killed
CRASH_WINDOW = 2.0  # a worker that dies sooner than this after starting is restarted with a growing delay
MAX_BACKOFF = 10.0
ASK_TIMEOUT = 0.5  # seconds the live view waits for a worker to say what it has in flight
# Bytes of messages a worker holds for a supervisor that does not read them fast enough before it
# drops records: at ~2 KB a record, some 8,000 records, seconds of a busy worker's traffic.
CHANNEL_BOUND = 16 * 1024 * 1024


def instance_id(index: int, base: Mapping[str, AnyValue]) -> str:
    """Worker `index`'s `service.instance.id`: the group's resource's (`OTEL_RESOURCE_ATTRIBUTES`,
    or the one the SDK generates) with `-index` appended, else a new uuid."""
    given = base.get("service.instance.id")
    return f"{given}-{index}" if isinstance(given, str) and given.strip() else str(uuid.uuid4())


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
    dropped: int = 0  # records the process in the slot says it dropped, as counted so far
    sink_errors: dict[str, float] = field(default_factory=dict)  # its sinks' failures, as counted so far
    mirror_dropped: dict[str, int] = field(default_factory=dict)  # --mirror copies it refused, likewise


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
        observers: Sequence[Named[RequestRecord]],
        env: Mapping[str, str],
        command: Sequence[str],
        spans: Spans,
        channel_bound: int = CHANNEL_BOUND,
    ) -> None:
        self.settings = settings
        self.channel_bound = channel_bound
        self.group = group
        self.spans = spans
        # The group's records fan out as one process's do (`proxy/exchange/observers.py`): the spans,
        # the metrics, then each observer, each in its own guard, counted in taotrace_sink_errors_total{sink}. The
        # workers' own sinks are counted here from their Records: at 0 from the start too, as in
        # one process (an alert on a series that does not exist yet never fires).
        in_workers = ("record", "workers_ship", *(("access_log",) if settings.access_log else ()))
        self.sinks: Observers[RequestRecord] = Observers(
            [Named("metrics", group.metrics.record), *observers],
            group.metrics.sink_errors,
            RateLimitedLog(log),
            more=("spans", *in_workers),
        )
        # Workers ship their spans' starts only when spans leave from here.
        self.ship_spans = spans.exporting
        self.env = env
        self.command = tuple(command)
        self._asked = 0

    def _apply(self, worker: _Worker, message: ToSupervisor | ToWorker) -> None:
        if isinstance(message, Records):
            self._records(worker, message)
        elif isinstance(message, InFlightAnswer):
            asked = worker.asks.pop(message.ask, None)
            if asked is not None and not asked.done():
                asked.set_result(message.requests)
        elif isinstance(message, Ready):
            worker.ready = True
        else:
            raise ChannelError(f"a {type(message).__name__} from a worker")

    def _records(self, worker: _Worker, message: Records) -> None:
        metrics, end, sinks = self.group.metrics, self.spans.end, self.sinks
        if message.dropped > worker.dropped:
            metrics.records_dropped.labels().inc(message.dropped - worker.dropped)
            worker.dropped = message.dropped
        if message.sink_errors != worker.sink_errors:
            for sink, count in message.sink_errors.items():
                more = count - worker.sink_errors.get(sink, 0.0)
                if more > 0:
                    metrics.sink_errors.labels(sink).inc(more)
            worker.sink_errors = dict(message.sink_errors)
        for reason, n in message.mirror_dropped.items():
            counted = worker.mirror_dropped.get(reason, 0)
            if n > counted:
                metrics.mirror.dropped.labels(reason).inc(n - counted)
                worker.mirror_dropped[reason] = n
        for rec in message.records:
            if rec.span is not None:  # the spans observer, with the worker's own resource
                try:
                    end(rec, worker.resource)
                except Exception as exc:  # noqa: BLE001 - telemetry never stops the group's metrics
                    self.sinks.failed("spans", exc)
            sinks(rec)
        if message.in_flight != worker.in_flight:
            worker.in_flight = message.in_flight
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
            w.writer.write(encode(AskInFlight(self._asked, want)))
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

    async def _talk(self, worker: _Worker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The channel to the worker in the slot, from its Hello until it closes."""
        assert worker.proc is not None
        hello = await receive_hello(reader)
        if hello is None:
            return  # it exited before it said anything
        refused = mismatch(hello)
        if refused is not None:  # its pickles would not mean what ours do: it never gets to send one
            log.error("worker %d (pid %d) refused: %s", worker.index, worker.proc.pid, refused)
            with contextlib.suppress(ProcessLookupError):
                worker.proc.kill()
            return
        worker.writer = writer
        settings = self.settings.model_dump(exclude_unset=True)  # as given: a worker checks them as the supervisor did
        if self.settings.mirror is not None and self.settings.mirror_max_per_minute is not None:
            # Each worker decides alone: it gets its share of the group's caps.
            workers = len(self.group.workers)
            settings["mirror_max_per_minute"] = worker_share(self.settings.mirror_max_per_minute, worker.index, workers)
            settings["mirror_concurrency"] = worker_share(self.settings.mirror_concurrency, worker.index, workers)
        writer.write(encode(Start(settings, worker.index, self.ship_spans, self.channel_bound)))
        while (message := await receive(reader)) is not None:
            self._apply(worker, message)

    def _count_lost(self, worker: _Worker) -> None:
        """A worker gone with requests in flight (as it last reported them): `worker_lost`."""
        lost = {key: int(n) for key, n in worker.in_flight.items() if n >= 1}
        if not lost:
            return
        for (upstream, api), n in lost.items():
            self.group.metrics.record_lost(upstream, api, n)
        pid = worker.proc.pid if worker.proc is not None else 0
        total = int(sum(lost.values()))
        log.warning(
            "worker %d (pid %d) ended with %d request%s in flight: counted as error_type worker_lost",
            worker.index, pid, total, "" if total == 1 else "s",
        )  # fmt: skip

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
            try:
                await self._talk(worker, reader, writer)
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
            self._count_lost(worker)
            worker.in_flight = {}
            worker.dropped = 0
            worker.sink_errors = {}
            worker.mirror_dropped = {}
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
    settings: Settings | Config,
    *,
    on_record: Callable[[RequestRecord], None] | None = None,
    registry: CollectorRegistry | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 60.0,
    worker_command: Sequence[str] = (sys.executable, "-m", "proxy.workers.worker"),
    meter_provider: MetricPipeline | None = None,
    tracing: Tracing | None = None,
    channel_bound: int = CHANNEL_BOUND,
    shutdown: Shutdown | None = None,
) -> AsyncIterator[Group]:
    """Start `settings.workers` workers and the group's metrics port; drain them all on exit.
    `settings`: as given, or the configuration already loaded from them (`proxy.config.config`).

    Yields once every worker is serving (or `ready_timeout` passed: /readyz then says so).
    `worker_command` runs one worker (its socket's fd is appended); benchmarks wrap it.
    `tracing` / `meter_provider`: where the group's spans and OTLP metrics go (by
    default, built from `env`'s `OTEL_*`); one passed in is not shut down.
    `channel_bound`: bytes of messages each worker holds for this supervisor before it drops records.
    `shutdown`: the signals, heard from the start: a first one ends the wait for the workers
    (a worker that never gets ready must not make Ctrl-C wait for `ready_timeout`), a second
    cuts the drain at once."""
    env = os.environ if env is None else env
    config = settings if isinstance(settings, Config) else load(settings, env)
    settings = config.settings
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
        reporting = Reporting(
            config, on_record=on_record, registry=registry, tracing=tracing,
            meter_provider=meter_provider, env=env, serving=False,  # this loop only takes records
        )  # fmt: skip
        host, port = reserved[0].getsockname()[:2]
        group = Group(http_url(host, port), "", reporting.metrics, _slots(settings.workers, reporting.spans))
        # One salt of taotrace.key.id for the group: workers drawing their own would give a key one id per worker.
        worker_settings = settings.model_copy(update={"port": port, "key_salt": config.accounting.key_salt})
        supervisor = _Supervisor(
            worker_settings, group, reporting.observers, env, worker_command, reporting.spans, channel_bound
        )
        slots: list[asyncio.Future[None]] = []
        try:
            await reporting.start(
                metrics_socks,
                readiness=group.readiness,
                in_flight=lambda: int(sum(n for w in group.workers for n in w.in_flight.values())),
                active=supervisor.running,  # what runs now, asked of the workers when the page polls
            )
            group.metrics_url, group.metrics_addresses = reporting.metrics_url, reporting.metrics_addresses
            slots += [asyncio.ensure_future(supervisor.run_slot(w)) for w in group.workers]
            deadline = time.monotonic() + ready_timeout
            while group.readiness() != "ready" and time.monotonic() < deadline:
                if all(s.done() for s in slots) or (shutdown is not None and shutdown.requested.is_set()):
                    break
                await asyncio.sleep(0.02)
            yield group
        finally:
            await _stop(group, slots, settings.drain_seconds + KILL_GRACE, None if shutdown is None else shutdown.now)
            await reporting.close(hurried=group.hurried)
    finally:
        for sock in reserved + metrics_socks:
            sock.close()


def _slots(workers: int, spans: Spans) -> list[_Worker]:
    """The group's slots; each worker's spans leave under the group's resource with its own instance id."""
    base = spans.tracing.resource
    return [
        _Worker(
            i, Resource({**base.attributes, "service.instance.id": instance_id(i, base.attributes)}, base.schema_url)
        )
        for i in range(workers)
    ]


async def _stop(group: Group, slots: Sequence[asyncio.Future[None]], limit: float, now: asyncio.Event | None) -> None:
    """SIGTERM to every worker (each drains), SIGKILL to those still running after `limit`
    seconds; once `now` is set (a second signal), every worker cuts its streams at once."""
    group.draining = group.stopping = True
    group.signal_all(signal.SIGTERM)
    cutter = asyncio.ensure_future(_cut_on(now, group)) if now is not None else None
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


async def _cut_on(now: asyncio.Event, group: Group) -> None:
    await now.wait()
    group.cut()
