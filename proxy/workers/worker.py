"""One serving process of `taotrace serve --workers N`: `python -m proxy.workers.worker FD`.

It says Hello to the supervisor on the socket FD (its version: a supervisor of other code refuses
it), is told how to serve (`Start`), then runs the proxy port (`proxy.server.serving`) on the shared
port (SO_REUSEPORT) with its own reporting, as one process has it (`Reporting`, without the
metrics port): it records its requests' metrics, keeps its live view, and starts, ends and
exports its spans and OTLP metrics itself, under its own `service.instance.id`. The supervisor
gets no record: a `Reporter` sends it the metrics' changes every `REPORT_SECONDS` and when
/metrics is scraped, and the live view's questions are answered from this process's `LiveView`.

A worker never blocks on the supervisor: while `Start.max_buffered` bytes or more wait unsent,
it sends no report (the next one carries the changes: nothing is lost) and answers no question
(the supervisor stops waiting for it).

It stops on SIGTERM (drain, as one process does; a second SIGTERM cuts), and also when the
supervisor goes away (its end of the socket closes), so a killed supervisor leaves no orphans.
Workers run in their own session: a Ctrl-C in the terminal reaches the supervisor only, which
passes it on once (two signals at once would cut instead of drain).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from contextlib import suppress
from typing import Any

import orjson

from proxy.config.config import load
from proxy.config.settings import Settings
from proxy.exchange.inflight import InFlightRequests
from proxy.reporting.reporting import Reporting
from proxy.server.lifecycle import LOOP_SWITCH_INTERVAL, Shutdown, configure_logging, run_loop, settle_heap
from proxy.server.listen import bind
from proxy.server.serving import serving
from proxy.telemetry.metrics import Metrics
from proxy.ui.live import LiveView
from proxy.workers.channel import encode, encode_hello, receive
from proxy.workers.deltas import Changes
from proxy.workers.live import untraced_id
from proxy.workers.messages import SCHEMA, VERSION, Answer, Ask, Hello, Ready, Report, Start

__all__ = ["REPORT_SECONDS", "Reporter", "main"]

log = logging.getLogger("taotrace")
# The metrics' changes reach the supervisor this often (and at each scrape): a request that
# starts less than this before its worker dies may be in no count (docs/deploy.md).
REPORT_SECONDS = 1.0
FINAL_FLUSH_SECONDS = 2.0  # the last report at exit waits this long at most for the supervisor to read


class Reporter:
    """What a worker sends its supervisor: its metrics' changes (`Changes`), never blocking."""

    def __init__(self, writer: asyncio.StreamWriter, metrics: Metrics, max_buffered: int) -> None:
        self.writer = writer
        self.max_buffered = max_buffered
        self.changes = Changes(metrics)

    def buffered(self) -> int:
        """Bytes written and not yet taken by the socket."""
        return self.writer.transport.get_write_buffer_size()

    def open(self) -> bool:
        """Whether a message can be written now (the supervisor reads, within the bound)."""
        return not self.writer.is_closing() and self.buffered() < self.max_buffered

    def report(self, ask: int = 0) -> None:
        """The changes since the last report (none, too: the supervisor hears that this loop runs)."""
        if not self.open():
            return  # held back: the next report carries them
        self.writer.write(encode(Report(self.changes.take(), ask)))

    async def every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            self.report()


def _rows(rows: list[dict[str, Any]], when: str, index: int, pid: int) -> list[tuple[float, bytes]]:
    """Rows as the supervisor merges them: (`when`, the row's JSON), the JSON written here once,
    with an id unique in the group (an untraced request's names this worker's slot and process)."""
    for r in rows:
        if not r["trace_id"]:
            r["id"] = untraced_id(index, pid, r["id"])
    return [(r[when], orjson.dumps(r)) for r in rows]


async def _live_answer(live: LiveView | None, ask: Ask, index: int) -> Any:
    """What this process's live view answers to `ask` (None without one)."""
    if live is None:
        return None
    if ask.what == "requests" and ask.query is not None:
        body = await live.requests(ask.query)
        pid = os.getpid()
        body["requests"] = _rows(body["requests"], "time", index, pid)
        body["in_flight"] = _rows(body["in_flight"], "started", index, pid)
        return body
    if ask.what == "request":
        return await live.request(ask.key)
    if ask.what == "pair":
        return await live.pair(ask.key)
    if ask.what == "summary":
        now = live.clock()
        return {"window": live.window.state(now), "pairs": live.pairs.state(now), "in_flight": live.in_flight()}
    return None


async def _answer(reader: asyncio.StreamReader, reporter: Reporter, live: LiveView | None, index: int) -> None:
    """Answer the supervisor's questions until it goes away."""
    while (message := await receive(reader)) is not None:
        if not isinstance(message, Ask):
            continue
        if message.what == "metrics":
            reporter.report(message.ask)
            continue
        body = await _live_answer(live, message, index)
        # An answer the supervisor would not read in time (it waits 0.5 s) is not queued either.
        if reporter.open():
            reporter.writer.write(encode(Answer(message.ask, body)))


async def _serve(sock: socket.socket) -> None:
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(encode_hello(Hello(VERSION, SCHEMA, os.getpid())))
    start = await receive(reader)
    if not isinstance(start, Start):
        return  # refused, or the supervisor went away before it said anything
    settings = Settings(**start.settings)
    configure_logging(settings.log_level)
    sys.setswitchinterval(LOOP_SWITCH_INTERVAL)
    # The group's port, bound by each worker with SO_REUSEPORT (the supervisor holds it too).
    socks = bind(settings.host, settings.port, port_flag="--port", host_flag="--host", backlog=2048, reuse_port=True)
    shutdown = Shutdown().install()  # first signal: drain; second: cut (as one process)
    reporter: Reporter | None = None
    reports: asyncio.Future[None] | None = None
    reporting: Reporting | None = None
    try:
        config = load(settings)  # the group's key salt is in the settings
        reporting = Reporting(config, instance=start.instance)
        reporter = Reporter(writer, reporting.metrics, start.max_buffered)
        requests = InFlightRequests()
        await reporting.start(
            (), readiness=lambda: "ready", in_flight=lambda: len(requests.tasks), active=requests.snapshot
        )
        reports = asyncio.ensure_future(reporter.every(REPORT_SECONDS))
        metrics = reporting.metrics
        async with serving(
            config, socks, requests, spans=reporting.spans, recorder=metrics, observers=reporting.observers,
            stop_now=shutdown.now, mirror_dropped=lambda reason: metrics.mirror.dropped.labels(reason).inc(),
            who=f"worker {start.index}, pid {os.getpid()}",
        ) as url:  # fmt: skip
            settle_heap()  # as serve(): start-up objects frozen, young collections rarer
            writer.write(encode(Ready()))
            log.debug("worker %d (pid %d) serving on %s", start.index, os.getpid(), url)
            orphaned = asyncio.ensure_future(_answer(reader, reporter, reporting.live, start.index))  # ends with it
            stopped = asyncio.ensure_future(shutdown.wait())
            await asyncio.wait((orphaned, stopped), return_when=asyncio.FIRST_COMPLETED)
            if orphaned.done():
                log.warning("worker %d: the supervisor is gone; draining", start.index)
            stopped.cancel()
    finally:
        for s in socks:
            s.close()
        if reports is not None:
            reports.cancel()
        if reporter is not None:
            reporter.report()  # what the drain's last requests added
        if reporting is not None:
            await reporting.close(hurried=shutdown.now.is_set())  # spans and OTLP metrics flushed
        with suppress(ConnectionError, asyncio.TimeoutError):
            await asyncio.wait_for(writer.drain(), FINAL_FLUSH_SECONDS)  # a stopped supervisor never reads
        writer.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the loop's handlers are in: the supervisor decides
    sock = socket.socket(fileno=int(args[0]))
    try:
        run_loop(_serve(sock))
    except OSError as exc:
        log.error("worker cannot serve: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
