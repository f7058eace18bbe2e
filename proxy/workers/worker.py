"""One serving process of `taotrace serve --workers N`: `python -m proxy.workers.worker FD`.

It runs the single-process proxy (`proxy.serve.running`) on the shared port (SO_REUSEPORT) with
a `Shipper` in place of local metrics: finished records and the in-flight counts go to the
supervisor, which aggregates them and serves /metrics. A worker never renders exposition text.

It stops on SIGTERM (drain, as one process does; a second SIGTERM cuts), and also when the
supervisor goes away (its end of the socket closes), so a killed supervisor leaves no orphans.
Workers run in their own session: a Ctrl-C in the terminal reaches the supervisor only, which
passes it on once (two signals at once would cut instead of drain).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import sys
from contextlib import suppress

from proxy.inflight import InFlightRequests
from proxy.lifecycle import Shutdown, run_loop
from proxy.record import RequestRecord
from proxy.serve import LOOP_SWITCH_INTERVAL, configure_logging, running
from proxy.settings import Settings
from proxy.telemetry.exposition import Counter, Gauge, Registry
from proxy.workers.channel import encode, receive

__all__ = ["Shipper", "main"]

log = logging.getLogger("taotrace")
GAUGE_PERIOD = 0.25  # seconds: in-flight counts reach the supervisor this often when they change
# Records wait this long to travel together: pickling one alone cost 17-23 us, in a batch of 32
# 9-12 us per record (its classes are written once per message).
BATCH_DELAY = 0.02


class Shipper:
    """The worker's `Recorder`: records are batched (`BATCH_DELAY`) and written to the
    supervisor; the in-flight gauge is kept locally and sent as absolute counts."""

    sink_name = "workers_ship"

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.in_flight = Gauge(
            "taotrace_in_flight_requests", "Requests being forwarded now.", ("upstream", "api"), registry=Registry()
        )
        # Counted and logged here; not sent to the supervisor's /metrics yet.
        self.sink_errors = Counter("taotrace_sink_errors", "Sink failures.", ("sink",), registry=Registry())
        self._pending: list[RequestRecord] = []
        self._sent_gauge: dict[tuple[str, ...], float] = {}

    def record(self, rec: RequestRecord) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_later(BATCH_DELAY, self.flush)
        self._pending.append(rec)

    def _gauge(self) -> dict[tuple[str, ...], float]:
        return {key: child.value for key, child in list(self.in_flight.children.items())}

    def flush(self) -> None:
        records, self._pending = self._pending, []
        gauge = self._gauge()
        if not records and gauge == self._sent_gauge:
            return
        self._sent_gauge = gauge
        if not self.writer.is_closing():
            self.writer.write(encode(("records", records, gauge)))

    async def keep_gauge_fresh(self) -> None:
        """In-flight counts change when requests start, not only when they end."""
        while True:
            await asyncio.sleep(GAUGE_PERIOD)
            self.flush()


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, requests: InFlightRequests) -> None:
    """Answer the supervisor's questions until it goes away: what is in flight (the live view)."""
    while (message := await receive(reader)) is not None:
        if message[0] == "in_flight?" and not writer.is_closing():
            writer.write(encode(("in_flight", message[1], requests.snapshot(message[2]))))


async def _serve(sock: socket.socket) -> None:
    reader, writer = await asyncio.open_connection(sock=sock)
    hello = await receive(reader)
    if hello is None or hello[0] != "start":
        return  # the supervisor went away before it said anything
    settings = Settings(**hello[1])
    index, ship_spans = hello[2], hello[3]
    configure_logging(settings.log_level)
    sys.setswitchinterval(LOOP_SWITCH_INTERVAL)
    shipper = Shipper(writer)
    shutdown = Shutdown().install()  # first signal: drain; second: cut (as one process)
    gauge = asyncio.ensure_future(shipper.keep_gauge_fresh())
    try:
        async with running(settings, recorder=shipper, stop_now=shutdown.now, ship_spans=ship_spans) as srv:
            gc.freeze()  # as serve(): start-up objects out of the collector's reach
            writer.write(encode(("ready",)))
            log.debug("worker %d (pid %d) serving on %s", index, os.getpid(), srv.proxy_url)
            orphaned = asyncio.ensure_future(_answer(reader, writer, srv.state.requests))  # ends with the supervisor
            stopped = asyncio.ensure_future(shutdown.wait())
            await asyncio.wait((orphaned, stopped), return_when=asyncio.FIRST_COMPLETED)
            if orphaned.done():
                log.warning("worker %d: the supervisor is gone; draining", index)
            stopped.cancel()
    finally:
        gauge.cancel()
        shipper.flush()
        with suppress(ConnectionError):
            await writer.drain()
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
