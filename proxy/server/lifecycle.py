"""Process lifetime shared by the long-running commands (serve, sim, demo): which event loop
runs them, what SIGINT/SIGTERM mean, and the drain at the end.

The first SIGINT or SIGTERM asks for a graceful stop: stop taking work, let what runs finish
(the drain). The second asks for an immediate one: what still runs is cut at once. A third
ends the process on the spot, in case the cut itself hangs.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "GC_YOUNG_THRESHOLD",
    "LOOP_SWITCH_INTERVAL",
    "Drained",
    "Shutdown",
    "configure_logging",
    "drain",
    "run_loop",
    "settle_heap",
]

T = TypeVar("T")
# The span exporter's thread keeps the GIL for up to the switch interval (5 ms by default)
# before the event loop gets it back, and every stream waits with it: a shorter interval bounds
# that wait (loop lag: docs/performance.md).
LOOP_SWITCH_INTERVAL = 0.001  # seconds, for every serving process (one, or a group's workers)
# The youngest generation is collected when allocations outnumber deallocations by this much.
# A request's objects live until it ends, so at the default (700) a burst of streams starting
# together crossed it mid-burst, again and again: each collection walked objects that were all
# alive, and its survivors fed the older, slower generations. At this threshold such a burst
# runs few collections or none (docs/performance.md).
GC_YOUNG_THRESHOLD = 10_000


def configure_logging(level: str) -> None:
    """Our log lines on stderr, one format for every process of a group."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def settle_heap() -> None:
    """Once started: everything built so far (modules, apps, pools) leaves the collector's reach
    (a full collection walks only what requests create), and the youngest generation waits for
    `GC_YOUNG_THRESHOLD` allocations."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on uvloop where it is installed (less per-chunk overhead), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - not on every platform
        return asyncio.run(main)
    except BaseException:  # a Ctrl-C this early: `main` never ran, so close it (no "never awaited")
        main.close()
        raise
    return uvloop.run(main)


class Shutdown:
    """What the signals asked for: `requested` (first), `now` (second); `first`: which signal
    asked first (None before any)."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.now = asyncio.Event()
        self.signals = 0
        self.first: int | None = None

    @property
    def exit_status(self) -> int:
        """The shell's status for "stopped by the first signal": 130 for SIGINT, 143 for SIGTERM."""
        return 128 + (self.first if self.first is not None else signal.SIGINT)

    def install(self) -> Shutdown:
        """Take SIGINT and SIGTERM on the running loop (until the process ends)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with suppress(NotImplementedError):  # pragma: no cover - Windows
                loop.add_signal_handler(sig, self.signal, sig)
        return self

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.signals += 1
        if self.signals == 1:
            self.first = signum
            self.requested.set()
        elif self.signals == 2:
            self.now.set()
        else:
            os._exit(128 + signum)  # the shell's convention for "killed by this signal"

    async def wait(self) -> None:
        """Return at the first signal."""
        await self.requested.wait()


@dataclass(frozen=True, slots=True, kw_only=True)
class Drained:
    """How a drain ended: requests that finished in time, requests cut, and whether a second
    signal (rather than the deadline) did the cutting."""

    finished: int
    cut: int
    hurried: bool

    def describe(self, deadline: float) -> str:
        why = "a second signal" if self.hurried else f"the {deadline:g}s deadline"
        plural = "" if self.finished == 1 else "s"
        return f"{self.finished} request{plural} finished, {self.cut} cut" + (f" ({why})" if self.cut else "")


async def drain(in_flight: set[asyncio.Task[Any]], deadline: float, now: asyncio.Event | None = None) -> Drained:
    """Let the tasks in `in_flight` run until they end, `deadline` seconds pass or `now` is set;
    cancel those left. A task that joins during the drain is cut with the rest."""
    seen = set(in_flight)
    if seen and not (now is not None and now.is_set()):
        waiting = asyncio.ensure_future(asyncio.wait(seen, timeout=deadline))
        hurry = asyncio.ensure_future(now.wait()) if now is not None else None
        try:
            await asyncio.wait({waiting} if hurry is None else {waiting, hurry}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (waiting, hurry):
                if future is not None:
                    future.cancel()
    hurried = now is not None and now.is_set()
    seen |= in_flight
    left = [task for task in seen if not task.done()]
    for task in left:
        task.cancel()
    return Drained(finished=len(seen) - len(left), cut=len(left), hurried=hurried)
