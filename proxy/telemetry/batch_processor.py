"""The batch span processor: finished spans queue on the event loop, one thread exports them.

`on_end` runs on the event loop for every request, so it is a bounded deque append and, only
when a full batch waits, a wake-up of the thread; no lock (deque appends and pops are atomic,
and one thread consumes). When the queue is full the span is dropped and counted
(`on_drop("queue_full", 1)`): a dead or slow collector costs spans, never request latency. A
batch the exporter does not deliver is counted too (`on_drop("export_failed", n)`).

The thread exports every `schedule_delay` seconds, or as soon as `max_export_batch_size` spans
wait. `force_flush` and `shutdown` return False rather than wait past their timeout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from proxy.telemetry.otlp import release_gil
from proxy.telemetry.spandata import SpanData, SpanExporter

__all__ = ["BatchSettings", "BatchSpanProcessor", "batch_settings"]

_logger = logging.getLogger(__name__)

OnDrop = Callable[[str, int], None]


@dataclass(frozen=True)
class BatchSettings:
    """The batch processor's limits (the OTel spec's defaults); times in seconds."""

    max_queue_size: int = 2048
    schedule_delay: float = 5.0
    max_export_batch_size: int = 512
    export_timeout: float = 30.0


def _positive_int(env: Mapping[str, str], name: str, default: int, log: logging.Logger) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value <= 0:
        log.warning("%s=%r is not a positive integer; using the default, %d", name, raw[:32], default)
        return default
    return value


def batch_settings(env: Mapping[str, str], log: logging.Logger = _logger) -> BatchSettings:
    """OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_SCHEDULE_DELAY (ms), OTEL_BSP_MAX_EXPORT_BATCH_SIZE and
    OTEL_BSP_EXPORT_TIMEOUT (ms), as the spec reads them. A bad value is the default and one warning
    naming the variable; a batch larger than the queue is the queue's size (the spec's rule)."""
    d = BatchSettings()
    queue = _positive_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", d.max_queue_size, log)
    batch = _positive_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", d.max_export_batch_size, log)
    if batch > queue:
        if "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" in env:
            log.warning(
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=%d is larger than the queue (OTEL_BSP_MAX_QUEUE_SIZE=%d); using %d",
                batch, queue, queue,
            )  # fmt: skip
        batch = queue
    delay = _positive_int(env, "OTEL_BSP_SCHEDULE_DELAY", int(d.schedule_delay * 1000), log)
    timeout = _positive_int(env, "OTEL_BSP_EXPORT_TIMEOUT", int(d.export_timeout * 1000), log)
    return BatchSettings(queue, delay / 1000, batch, timeout / 1000)


class _Flush:
    """A request to export everything queued before it; `done` is set once that is exported."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class BatchSpanProcessor:
    """Queues finished spans (bounded, dropping when full) and exports them in batches from one
    daemon thread. Implements `spandata.SpanProcessor`."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int = 2048,
        schedule_delay: float = 5.0,
        max_export_batch_size: int = 512,
        export_timeout: float = 30.0,
        on_drop: OnDrop | None = None,
        pause: Callable[[], None] | None = release_gil,
    ) -> None:
        """`pause`: called between two batches of one round (by default the GIL is given to the
        event loop); None where no loop relays streams."""
        if max_queue_size <= 0 or max_export_batch_size <= 0 or schedule_delay <= 0 or export_timeout <= 0:
            raise ValueError("batch processor limits must be positive")
        self.exporter = exporter
        self.max_queue_size = max_queue_size
        self.schedule_delay = schedule_delay
        self.max_export_batch_size = min(max_export_batch_size, max_queue_size)
        # The exporter bounds each export itself (OtlpSpanExporter: OTEL_EXPORTER_OTLP_TIMEOUT);
        # kept for the spec's variable and shown to whoever builds the exporter.
        self.export_timeout = export_timeout
        self._on_drop = on_drop
        self._pause = pause
        self._next_full_warning = 0.0
        self._stopping = False
        self._start()
        # A forked child has the queue but not the thread: give it its own (the SDK does the same).
        ref = weakref.WeakMethod(self._restart_in_child)

        def after_fork() -> None:
            restart = ref()
            if restart is not None:
                restart()

        os.register_at_fork(after_in_child=after_fork)

    @classmethod
    def from_env(
        cls,
        exporter: SpanExporter,
        env: Mapping[str, str],
        on_drop: OnDrop | None = None,
        pause: Callable[[], None] | None = release_gil,
    ) -> BatchSpanProcessor:
        """Limits from the OTEL_BSP_* variables (see `batch_settings`)."""
        s = batch_settings(env)
        return cls(
            exporter,
            max_queue_size=s.max_queue_size,
            schedule_delay=s.schedule_delay,
            max_export_batch_size=s.max_export_batch_size,
            export_timeout=s.export_timeout,
            on_drop=on_drop,
            pause=pause,
        )

    def _restart_in_child(self) -> None:
        if not self._stopping:
            self._start()

    def _start(self) -> None:
        self._queue: deque[SpanData] = deque()
        self._wake = threading.Event()
        self._flushes: deque[_Flush] = deque()
        self._thread = threading.Thread(target=self._run, name="taotrace-spans", daemon=True)
        self._thread.start()

    # -- the event loop's side ------------------------------------------------------------------

    def on_end(self, span: SpanData) -> None:
        queue = self._queue
        waiting = len(queue)
        if waiting >= self.max_queue_size:
            self._drop("queue_full", 1)
            now = time.monotonic()
            if now >= self._next_full_warning:  # one record a second at most: the loop is busy enough
                self._next_full_warning = now + 1.0
                _logger.warning("Queue full: spans are dropped")  # collector_log makes it our line
            return
        if self._stopping:
            return
        queue.append(span)
        # is_set is a plain read: a set() (a lock) only when a full batch waits and the thread
        # has not been woken yet. The thread clears the flag before it counts the queue, so a
        # span appended after its count always wakes it again.
        if waiting + 1 >= self.max_export_batch_size and not self._wake.is_set():
            self._wake.set()

    def force_flush(self, timeout: float) -> bool:
        """Export what is queued now; False if that is not done within `timeout` seconds."""
        if self._stopping or not self._thread.is_alive():
            return not self._queue
        flush = _Flush()
        self._flushes.append(flush)
        self._wake.set()
        # In slices: a shutdown racing this flush may end the thread before it sees the flush.
        deadline = time.monotonic() + timeout
        while not flush.done.wait(min(0.05, max(deadline - time.monotonic(), 0.0))):
            if not self._thread.is_alive():
                return not self._queue
            if time.monotonic() >= deadline:
                return False
        return True

    def shutdown(self, timeout: float) -> bool:
        """Export what is queued, then shut the exporter down; False (and the exporter told to
        stop) if that takes longer than `timeout` seconds, as with a collector that hangs."""
        if self._stopping:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            # The thread is stuck in an export: tell the exporter (OtlpSpanExporter then ends its
            # back-off at once and fails what is left) from a thread of its own, never blocking here.
            threading.Thread(target=self._shutdown_exporter, name="taotrace-spans-stop", daemon=True).start()
            return False
        if self._queue:  # appended on the loop after the thread's last look: never exported, so counted
            self._drop("export_failed", len(self._queue))
            self._queue.clear()
        return True

    # -- the thread's side ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            woken = self._wake.wait(self.schedule_delay)
            self._wake.clear()  # before the queue is counted: see on_end
            flushes = []
            while self._flushes:
                flushes.append(self._flushes.popleft())
            stopping = self._stopping
            # Woken by a full batch: full batches only (the rest waits for the delay); the delay
            # over, a flush or the end: everything queued now.
            self._export_queued(everything=not woken or bool(flushes) or stopping)
            for flush in flushes:
                flush.done.set()
            if stopping:
                self._export_queued(everything=True)  # spans that raced with the flag
                self._shutdown_exporter()
                return

    def _export_queued(self, everything: bool) -> None:
        queue, size = self._queue, self.max_export_batch_size
        left = len(queue)  # bounded: spans queued meanwhile wait for the next round
        while left >= size or (everything and left > 0):
            n = min(size, left)
            batch = [queue.popleft() for _ in range(n)]
            left -= n
            self._export(batch)
            if left and self._pause is not None:
                self._pause()  # between batches, let the event loop in

    def _export(self, batch: list[SpanData]) -> None:
        try:
            delivered = self.exporter.export(batch)
        except Exception as error:  # noqa: BLE001 - an exporter's bug costs this batch, not the thread
            _logger.warning("span export raised %s; %d spans dropped", type(error).__name__, len(batch))
            delivered = False
        if not delivered:
            self._drop("export_failed", len(batch))

    def _drop(self, reason: str, count: int) -> None:
        if self._on_drop is None:
            return
        try:
            self._on_drop(reason, count)
        except Exception as error:  # noqa: BLE001 - counting never breaks a request or the thread
            _logger.debug("on_drop raised %s", type(error).__name__)

    def _shutdown_exporter(self) -> None:
        try:
            self.exporter.shutdown()
        except Exception as error:  # noqa: BLE001 - shutting down never raises to the caller
            _logger.warning("span exporter shutdown raised %s", type(error).__name__)
