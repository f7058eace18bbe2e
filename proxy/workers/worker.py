"""One serving process of `taotrace serve --workers N`: `python -m proxy.workers.worker FD`.

It says Hello to the supervisor on the socket FD (its version: a supervisor of other code refuses
it), is told how to serve (`Start`), then runs the proxy port (`proxy.server.serving`) on the shared
port (SO_REUSEPORT) with a `Shipper` in place of local metrics: finished records and the
in-flight counts go to the supervisor, which aggregates them and serves /metrics. A worker never
renders exposition text, and never blocks on the supervisor: what it cannot send is bounded
(`Start.max_buffered`), and past that it drops records and says how many.

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

from proxy.config.config import load
from proxy.config.settings import Settings
from proxy.exchange.inflight import InFlightRequests
from proxy.exchange.record import RequestRecord
from proxy.reporting.reporting import spans_for
from proxy.server.lifecycle import LOOP_SWITCH_INTERVAL, Shutdown, configure_logging, run_loop, settle_heap
from proxy.server.listen import bind
from proxy.server.serving import serving
from proxy.telemetry.exposition import Counter, Gauge, Registry
from proxy.telemetry.tracing import build_tracing
from proxy.workers.binning import binned
from proxy.workers.channel import encode, encode_hello, receive
from proxy.workers.messages import SCHEMA, VERSION, AskInFlight, Hello, InFlightAnswer, Ready, Records, Start

__all__ = ["Shipper", "main"]

log = logging.getLogger("taotrace")
GAUGE_PERIOD = 0.25  # seconds: in-flight counts reach the supervisor this often when they change
# Records wait at most BATCH_DELAY to travel together, or go as soon as BATCH_RECORDS wait: each
# message costs the supervisor a wake-up and a read on top of its records (see docs/performance.md).
BATCH_DELAY = 0.005
BATCH_RECORDS = 128
FINAL_FLUSH_SECONDS = 2.0  # the last records at exit wait this long at most for the supervisor to read


class Shipper:
    """The worker's `Recorder`: records are batched (`BATCH_DELAY`, `BATCH_RECORDS`) and written
    to the supervisor; the in-flight gauge is kept locally and sent as absolute counts.

    Never blocks and never grows without bound: while `max_buffered` bytes or more wait unsent
    (a supervisor that stopped reading), a batch is dropped instead, and `dropped` counts its
    records; the count travels with the next batch that is sent. `--mirror` copies a cap
    refused are counted here too (`mirror_dropped`) and travel the same way."""

    sink_name = "workers_ship"

    def __init__(self, writer: asyncio.StreamWriter, max_buffered: int, *, binning: bool = False) -> None:
        """`binning`: long series are binned here (`binning.py`), which takes work off a supervisor
        that several workers share; with one worker (`--telemetry-process`) the supervisor has CPU
        to spare, and binning would only add to the serving loop's."""
        self.writer = writer
        self.max_buffered = max_buffered
        self.binning = binning
        self.in_flight = Gauge(
            "taotrace_in_flight_requests", "Requests being forwarded now.", ("upstream", "api"), registry=Registry()
        )
        self.dropped = 0
        # The observers' failures are counted here; the counts travel to the supervisor.
        self.sink_errors = Counter("taotrace_sink_errors", "Sink failures.", ("sink",), registry=Registry())
        self.mirror_drops: dict[str, int] = {}
        self._pending: list[RequestRecord] = []
        self._due: asyncio.Handle | None = None  # the flush of the records pending
        self._sent_gauge: dict[tuple[str, ...], float] = {}
        self._sent_dropped = 0
        self._sent_errors: dict[str, float] = {}
        self._sent_mirror_drops: dict[str, int] = {}

    def record(self, rec: RequestRecord) -> None:
        pending = self._pending
        pending.append(binned(rec) if self.binning else rec)  # here, one by one: a batch's flush stays short
        if len(pending) == 1:
            self._due = asyncio.get_running_loop().call_later(BATCH_DELAY, self.flush)
        elif len(pending) == BATCH_RECORDS:  # a full batch goes on the next turn of the loop
            if self._due is not None:
                self._due.cancel()
            self._due = asyncio.get_running_loop().call_soon(self.flush)

    def mirror_dropped(self, reason: str) -> None:
        """A `--mirror` copy a cap refused (`serving`'s hook): sent with the next batch, or with
        the in-flight counts within `GAUGE_PERIOD`."""
        self.mirror_drops[reason] = self.mirror_drops.get(reason, 0) + 1

    def _gauge(self) -> dict[tuple[str, ...], float]:
        return {key: child.value for key, child in list(self.in_flight.children.items())}

    def buffered(self) -> int:
        """Bytes written and not yet taken by the socket."""
        return self.writer.transport.get_write_buffer_size()

    def _errors(self) -> dict[str, float]:
        return {key[0]: child.value for key, child in list(self.sink_errors.children.items()) if child.value}

    def flush(self) -> None:
        if self._due is not None:
            self._due.cancel()
            self._due = None
        records, self._pending = self._pending, []
        gauge, errors = self._gauge(), self._errors()
        drops = self.mirror_drops
        if (
            not records
            and gauge == self._sent_gauge
            and self.dropped == self._sent_dropped
            and errors == self._sent_errors
            and drops == self._sent_mirror_drops
        ):
            return
        if self.writer.is_closing():
            return
        if self.buffered() >= self.max_buffered:
            self.dropped += len(records)  # the gauge and the count go with the next batch that fits
            return
        self._sent_gauge, self._sent_dropped = gauge, self.dropped
        self._sent_errors, self._sent_mirror_drops = errors, dict(drops)
        self.writer.write(encode(Records(records, gauge, self.dropped, errors, dict(drops))))

    async def keep_gauge_fresh(self) -> None:
        """In-flight counts change when requests start, not only when they end."""
        while True:
            await asyncio.sleep(GAUGE_PERIOD)
            self.flush()


async def _answer(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, requests: InFlightRequests, shipper: Shipper
) -> None:
    """Answer the supervisor's questions until it goes away: what is in flight (the live view)."""
    while (message := await receive(reader)) is not None:
        # An answer the supervisor would not read in time (it waits 0.5 s) is not queued either.
        if isinstance(message, AskInFlight) and not writer.is_closing() and shipper.buffered() < shipper.max_buffered:
            writer.write(encode(InFlightAnswer(message.ask, requests.snapshot(message.want))))


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
    shipper = Shipper(writer, start.max_buffered, binning=settings.workers > 1)
    shutdown = Shutdown().install()  # first signal: drain; second: cut (as one process)
    gauge = asyncio.ensure_future(shipper.keep_gauge_fresh())
    try:
        config = load(settings)  # the group's key salt is in the settings
        # Spans are started here (ids, sampling, traceparent) and finished by the supervisor, or not at all.
        spans = spans_for(config, build_tracing(export=False), ship=start.ship_spans)
        requests = InFlightRequests()
        async with serving(
            config, socks, requests, spans=spans, recorder=shipper, observers=(),
            stop_now=shutdown.now, mirror_dropped=shipper.mirror_dropped,
            who=f"worker {start.index}, pid {os.getpid()}",
        ) as url:  # fmt: skip
            settle_heap()  # as serve(): start-up objects frozen, young collections rarer
            writer.write(encode(Ready()))
            log.debug("worker %d (pid %d) serving on %s", start.index, os.getpid(), url)
            orphaned = asyncio.ensure_future(_answer(reader, writer, requests, shipper))  # ends with the supervisor
            stopped = asyncio.ensure_future(shutdown.wait())
            await asyncio.wait((orphaned, stopped), return_when=asyncio.FIRST_COMPLETED)
            if orphaned.done():
                log.warning("worker %d: the supervisor is gone; draining", start.index)
            stopped.cancel()
    finally:
        for s in socks:
            s.close()
        gauge.cancel()
        shipper.flush()
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
