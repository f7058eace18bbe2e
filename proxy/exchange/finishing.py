"""Requests' bookkeeping, queued and done one request per turn of the event loop.

A request's bookkeeping (its record, spans, metrics, live view) is not done on the handler's step
that ends it but queued, and the queue drained one record per turn of the loop: when many streams
end together, each one's bookkeeping used to run before the next stream's last bytes, already
readable, were read and relayed, and their last tokens were stamped late (docs/performance.md).
Every instant a record holds is taken before it is queued.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

__all__ = ["Finishing"]


class Finishing:
    """Requests' bookkeeping, queued and done one request per turn of the event loop.

    `add` queues a callable and, if none is scheduled, a drain with `loop.call_soon`; each drain
    runs one and schedules the next while any are left. A `call_soon` from a loop callback runs
    only after the loop has polled its sockets again, so bytes that became readable meanwhile on
    other connections are read and relayed before the next request's bookkeeping.
    Past `backlog` queued, a drain also runs the excess: under a burst that never lets the loop
    idle, the queue stays bounded and a record is late by at most that many turns. `flush` runs what is left (at exit).
    """

    __slots__ = ("_backlog", "_queue", "_scheduled")

    def __init__(self, backlog: int = 64) -> None:
        self._queue: deque[Callable[[], None]] = deque()
        self._scheduled = False
        self._backlog = backlog

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, work: Callable[[], None]) -> None:
        """Run `work` on a later turn of the running loop (after its next poll of sockets)."""
        self._queue.append(work)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        queue = self._queue
        try:
            if queue:  # empty after a `flush`
                queue.popleft()()
            while len(queue) > self._backlog:
                queue.popleft()()
        finally:
            if queue:
                asyncio.get_running_loop().call_soon(self._drain)
            else:
                self._scheduled = False

    def flush(self) -> None:
        """Run everything queued now (a drain already scheduled then finds nothing to do)."""
        queue = self._queue
        while queue:
            queue.popleft()()
