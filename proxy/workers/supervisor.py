"""`taotrace serve --workers N`: N serving processes on one port, one supervisor for the group.

    supervisor: /metrics /healthz /readyz and the live view, for the whole group
      │   one socketpair per worker: Hello, Start, then Reports of its metrics' changes ───────┐
      ├── worker 0  `python -m proxy.workers.worker`: the proxy on :PORT (SO_REUSEPORT) ──────┤
      └── worker 1  ...                                                                       ┘

The supervisor binds the proxy port first, with SO_REUSEPORT and without listening: that
resolves port 0, fails early when the port is taken, and holds the port across worker
restarts. Each worker binds the same port with SO_REUSEPORT and the kernel spreads new
connections over the listening workers (Linux).

Each worker is one process's reporting without the metrics port: it records its own requests,
keeps its own live view, and exports its own spans and OTLP metrics (the group's resource, its own
`service.instance.id`). Nothing crosses per request: every `REPORT_SECONDS`, and each time
/metrics is scraped (the supervisor asks every worker first, waiting `ASK_TIMEOUT` at most), a
worker sends what changed in its metrics, and the supervisor adds it to the group's families
(`deltas.py`) and renders the page. The live view asks the workers when its page polls
(`live.py`). So the supervisor's work grows with the series and the page's polls, never with the
requests served.

The channel (channel.py, messages.py): a worker says Hello with its version and is refused,
with a log line, unless it runs this supervisor's very code (an in-place upgrade restarts
workers from new code under the old supervisor); what a worker cannot send yet (a supervisor
that does not read) waits in it, bounded, and its next report carries it.

`--mirror` runs in the workers: each copies the requests it serves, within its share of the
group's caps (`worker_share`, sent in its `Start`).

A worker that dies is logged and started again (`taotrace_worker_restarts_total`); the other
workers' streams are untouched, the dead one's connections are cut by the kernel. Its requests
in flight at its last report are counted as `error_type="worker_lost"` (what it served after
that report is in no count, and nothing of it is counted twice: its successor starts from 0).
SIGTERM or SIGINT: /readyz turns 503 and every worker drains within `--drain-seconds`; a
second signal cuts them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.util.types import AnyValue
from prometheus_client import CollectorRegistry

from proxy.config.config import Config, load
from proxy.config.settings import Settings
from proxy.exchange.mirror import worker_share
from proxy.reporting.reporting import MetricsPort, metrics_for
from proxy.server.lifecycle import Shutdown
from proxy.server.listen import bind, http_url
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.tracing import check_tracing
from proxy.ui.ring import Query
from proxy.workers.channel import ChannelError, encode, mismatch, receive, receive_hello
from proxy.workers.deltas import Held, Merge
from proxy.workers.live import GroupLive
from proxy.workers.messages import Answer, Ask, Ready, Report, Start, ToSupervisor, ToWorker

__all__ = ["ASK_TIMEOUT", "CHANNEL_BOUND", "Group", "instance_id", "supervising"]

log = logging.getLogger("taotrace")
STALLED = 5.0  # seconds a serving worker may send nothing (it reports every second) before it counts as stuck
KILL_GRACE = 10.0  # seconds past drain_seconds (+ span flush) before a worker that will not exit is killed
CRASH_WINDOW = 2.0  # a worker that dies sooner than this after starting is restarted with a growing delay
MAX_BACKOFF = 10.0
ASK_TIMEOUT = 0.5  # seconds a scrape or the live view waits for a worker's answer: a stuck one is left out
# Bytes of messages a worker holds for a supervisor that does not read them fast enough before it
# holds its reports back (they wait in the worker, summed into its next one) and answers nothing.
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
    instance: str = ""  # its spans' and OTLP metrics' service.instance.id, the same across restarts
    proc: asyncio.subprocess.Process | None = None
    ready: bool = False
    started: float = 0.0
    writer: asyncio.StreamWriter | None = None  # to the process in the slot now
    asks: dict[int, asyncio.Future[Any]] = field(default_factory=dict)  # questions waiting for its answer
    held: Held = field(default_factory=dict)  # what its summed gauges (requests in flight) add to the group's
    heard: float = 0.0  # when it last sent anything (monotonic)
    stalled: bool = False  # said to be stuck (`STALLED`), until it is heard again

    def silent(self, now: float) -> bool:
        """Serving, and nothing heard from it for `STALLED` seconds: its loop is stuck or stopped."""
        return self.ready and now - self.heard > STALLED

    @property
    def in_flight(self) -> dict[tuple[str, ...], float]:
        """(upstream, api) -> its requests in flight, as its last report had them."""
        return {labels: n for (name, labels), n in self.held.items() if name == _IN_FLIGHT}


_IN_FLIGHT = "taotrace_in_flight_requests"


async def _nothing() -> None:
    return None


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
    hurried: bool = False  # a second signal: the drain is cut
    # Every worker's latest changes applied now (what a scrape does first): the metrics are exact.
    refresh: Callable[[], Awaitable[None]] = _nothing

    def readiness(self) -> str:
        if self.draining:
            return "draining"
        if not all(w.ready for w in self.workers):
            return "starting"
        now = time.monotonic()
        if any(w.silent(now) for w in self.workers):
            return "stalled"  # the kernel still hands it connections, which wait
        return "ready"

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
        env: Mapping[str, str],
        command: Sequence[str],
        channel_bound: int = CHANNEL_BOUND,
    ) -> None:
        self.settings = settings
        self.channel_bound = channel_bound
        self.group = group
        self.merge = Merge(group.metrics)
        self.env = env
        self.command = tuple(command)
        self._asked = 0

    def _apply(self, worker: _Worker, message: ToSupervisor | ToWorker) -> None:
        worker.heard = time.monotonic()
        if isinstance(message, Report):
            try:
                self.merge.apply(message.changes, worker.held)
            except KeyError as exc:  # a family this supervisor does not have: not our code
                raise ChannelError(f"a report of an unknown family {exc}") from None
            if message.ask:
                self._answered(worker, message.ask, None)
        elif isinstance(message, Answer):
            self._answered(worker, message.ask, message.body)
        elif isinstance(message, Ready):
            worker.ready = True
        else:
            raise ChannelError(f"a {type(message).__name__} from a worker")

    @staticmethod
    def _answered(worker: _Worker, ask: int, body: Any) -> None:
        asked = worker.asks.pop(ask, None)
        if asked is not None and not asked.done():
            asked.set_result(body)

    async def ask(
        self,
        what: str,
        *,
        query: Callable[[int, int], Query] | None = None,
        key: str = "",
        only: int | None = None,
    ) -> list[tuple[int, int, Any]]:
        """Ask every serving worker (or worker `only`) `what` (see `messages.Ask`; `query(index,
        pid)`: its query); (index, pid, answer) of those that answered within `ASK_TIMEOUT`."""
        loop = asyncio.get_running_loop()
        asked = []
        for w in self.group.workers:
            if w.writer is None or w.writer.is_closing() or not w.ready or w.proc is None:
                continue
            if only is not None and w.index != only:
                continue
            if w.writer.transport.get_write_buffer_size() > self.channel_bound:
                continue  # a worker not reading (stuck, or stopped): questions would only pile up
            self._asked += 1
            w.asks[self._asked] = future = loop.create_future()
            pid = w.proc.pid
            w.writer.write(encode(Ask(self._asked, what, None if query is None else query(w.index, pid), key)))
            asked.append((w, pid, self._asked, future))
        if not asked:
            return []
        await asyncio.wait([future for *_, future in asked], timeout=ASK_TIMEOUT)
        out = []
        for w, pid, n, future in asked:
            w.asks.pop(n, None)
            if future.done() and not future.cancelled():
                out.append((w.index, pid, future.result()))
        return out

    async def refresh(self) -> None:
        """Every worker's metrics' changes until now applied (a worker slower than `ASK_TIMEOUT`:
        as of its last report)."""
        await self.ask("metrics")

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
        writer.write(encode(Start(settings, worker.index, worker.instance, self.channel_bound)))
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
            self.merge.release(worker.held)  # its successor's counts start from 0
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
    registry: CollectorRegistry | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 60.0,
    worker_command: Sequence[str] = (sys.executable, "-m", "proxy.workers.worker"),
    channel_bound: int = CHANNEL_BOUND,
    shutdown: Shutdown | None = None,
) -> AsyncIterator[Group]:
    """Start `settings.workers` workers and the group's metrics port; drain them all on exit.
    `settings`: as given, or the configuration already loaded from them (`proxy.config.config`).

    Yields once every worker is serving (or `ready_timeout` passed: /readyz then says so).
    `registry`: where the group's `taotrace_*` families are registered too (tests read them).
    `env`: the workers' environment (their `OTEL_*`: each builds its spans' and OTLP metrics'
    exporters; checked here first, so one that cannot be set up stops the start, as in one process).
    `worker_command` runs one worker (its socket's fd is appended); benchmarks wrap it.
    `channel_bound`: bytes of messages each worker holds for this supervisor before it holds its reports back.
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
        resource = check_tracing(env)  # what each worker will make of OTEL_*: a TracingError stops here
        host, port = reserved[0].getsockname()[:2]
        slots = [_Worker(i, instance_id(i, resource.attributes)) for i in range(settings.workers)]
        group = Group(http_url(host, port), "", metrics_for(config, registry), slots)
        # One salt of taotrace.key.id for the group: workers drawing their own would give a key one id per worker.
        worker_settings = settings.model_copy(update={"port": port, "key_salt": config.accounting.key_salt})
        supervisor = _Supervisor(worker_settings, group, env, worker_command, channel_bound)
        group.refresh = supervisor.refresh
        live = GroupLive(supervisor.ask, settings.ui_requests) if settings.ui else None
        port_ = MetricsPort()
        running: list[asyncio.Future[None]] = []
        watch: asyncio.Future[None] | None = None
        try:
            await port_.start(
                metrics_socks, config, group.metrics.registry.pages, group.readiness, live, refresh=supervisor.refresh
            )
            group.metrics_url, group.metrics_addresses = port_.url, port_.addresses
            running += [asyncio.ensure_future(supervisor.run_slot(w)) for w in group.workers]
            watch = asyncio.ensure_future(_watch(group))
            deadline = time.monotonic() + ready_timeout
            while group.readiness() != "ready" and time.monotonic() < deadline:
                if all(s.done() for s in running) or (shutdown is not None and shutdown.requested.is_set()):
                    break
                await asyncio.sleep(0.02)
            yield group
        finally:
            if watch is not None:
                watch.cancel()
            await _stop(group, running, settings.drain_seconds + KILL_GRACE, None if shutdown is None else shutdown.now)
            await port_.close()
    finally:
        for sock in reserved + metrics_socks:
            sock.close()


async def _watch(group: Group) -> None:
    """Say once when a serving worker sends nothing for `STALLED` seconds (its loop is stuck or
    the process stopped: `/readyz` says `stalled`), and when it is heard again."""
    while True:
        await asyncio.sleep(1.0)
        now = time.monotonic()
        for w in group.workers:
            late = w.silent(now)
            if late != w.stalled:
                w.stalled = late
                pid = w.proc.pid if w.proc is not None else 0
                if late:
                    log.warning(
                        "worker %d (pid %d) has sent nothing for %.0fs: its event loop is stuck or the process is "
                        "stopped; /readyz says stalled", w.index, pid, STALLED,
                    )  # fmt: skip
                else:
                    log.warning("worker %d (pid %d) is heard again", w.index, pid)


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
