"""WARNING lines through a `LogLimiter`: the first of a kind at once, then a count per interval.

The one place that turns the limiter's decisions into log records. Callers build each line from
a fixed vocabulary (an address and a cause word, never an exception's text), so a line is also
its kind. `flushing()` runs the periodic summaries on the event loop for as long as it is open,
and logs what is still counted when it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable

from proxy.logs.limiter import LogLimiter, Repeats

__all__ = ["RateLimitedLog", "flushing", "summary"]

DEFAULT_INTERVAL = 60.0  # seconds


def summary(repeats: Repeats[str]) -> str:
    """`line (37 more in the last 60 s)`."""
    seconds = f"{repeats.seconds:.0f}" if repeats.seconds >= 1 else f"{repeats.seconds:.1f}"  # never "the last 0 s"
    return f"{repeats.kind} ({repeats.count} more in the last {seconds} s)"


class RateLimitedLog:
    """Rate-limited warnings on `logger`. Safe from any thread: exporters call it from theirs."""

    def __init__(
        self, logger: logging.Logger, *, interval: float = DEFAULT_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._limiter: LogLimiter[str] = LogLimiter(interval, clock)
        self._lock = threading.Lock()

    def warning(self, line: str) -> None:
        """Log `line` now if it is the first of its kind in this interval, else count it."""
        with self._lock:
            admitted = self._limiter.admit(line)
        if admitted:
            self.logger.warning("%s", line)

    def flush(self) -> None:
        """Log the counts whose interval has ended."""
        with self._lock:
            due = self._limiter.due()
        for repeats in due:
            self.logger.warning("%s", summary(repeats))

    def close(self) -> None:
        """Log every count still held (at exit: nothing counted is lost)."""
        with self._lock:
            pending = self._limiter.pending()
        for repeats in pending:
            self.logger.warning("%s", summary(repeats))


@contextlib.asynccontextmanager
async def flushing(log: RateLimitedLog) -> AsyncIterator[RateLimitedLog]:
    """Flush `log` a few times an interval while open (a summary comes at most a quarter of an
    interval late); on exit, log what is still counted."""

    async def tick() -> None:
        while True:
            await asyncio.sleep(log.interval / 4)
            log.flush()

    task = asyncio.ensure_future(tick())
    try:
        yield log
    finally:
        task.cancel()
        await asyncio.wait([task])  # unlike `await task`, never mistakes its cancellation for ours
        log.close()
