"""The live view's state: fed each finished record as one of the observers (`proxy/exchange/observers.py`).

`observe` runs on the event loop once per request, at finish, after the client has its last
byte: an append to the ring and a few counter updates (its cost: docs/live-view.md).
Requests still running are not kept here: `active` asks for them when the page polls (this
process's `InFlightRequests`).

The page's questions (`requests`, `request`, `pair`, `summary`) are answered by a `LiveSource`:
a `LiveView` from its own state, or a group's supervisor by asking each worker's `LiveView` and
merging their answers (`proxy/workers/live.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from proxy.exchange.inflight import InFlight
from proxy.exchange.record import RequestRecord
from proxy.ui.pairs import Pairs, differences
from proxy.ui.render import detail, row
from proxy.ui.ring import Query, Ring, distinct, select
from proxy.ui.running import running_detail, running_matches, running_row
from proxy.ui.summary import Window

__all__ = ["ROWS_PER_SLICE", "Active", "LiveSource", "LiveView"]

# The requests in flight now (all, or the one with that id, with its gaps).
Active = Callable[[str | None], Sequence[InFlight]]
ROWS_PER_SLICE = 200  # rows rendered between yields to the loop: a short hold (docs/live-view.md)

log = logging.getLogger("taotrace")


def _none(_want: str | None) -> Sequence[InFlight]:
    return ()


class LiveSource(Protocol):
    """What the page's API asks (`proxy/ui/web.py`); each answer is JSON-able, None: not found."""

    @property
    def capacity(self) -> int:
        """Finished requests kept (`--ui-requests`): the most a page may ask for."""
        ...

    async def requests(self, query: Query) -> dict[str, Any]: ...

    async def request(self, id_: str) -> dict[str, Any] | None: ...

    async def pair(self, pair_id: str) -> dict[str, Any] | None: ...

    async def summary(self) -> dict[str, Any]: ...


class LiveView:
    """Recent requests (a ring), the last 15 minutes (a window of client requests, and the pairs
    `--mirror` made), and the demo's experiments."""

    def __init__(
        self,
        capacity: int = 1000,
        *,
        in_flight: Callable[[], int] = lambda: 0,
        active: Active = _none,
        capture_content: bool = False,
        trace_url: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`trace_url`: a trace viewer's address with `{trace_id}` (`--trace-url`), linked from each detail."""
        self.ring = Ring(capacity)
        self.window = Window()
        self.pairs = Pairs()
        self.in_flight = in_flight
        self.active = active
        self.capture_content = capture_content
        self.trace_url = trace_url
        self.clock = clock
        self.experiments: Mapping[str, Any] | None = None

    @property
    def capacity(self) -> int:
        return self.ring.capacity

    def observe(self, record: RequestRecord) -> None:
        """The observer: never raises into the request that just finished."""
        try:
            now = self.clock()
            self.ring.add(record, now)
            if not record.mirror:  # a mirror copy is not client traffic: kept out of the request statistics
                self.window.add(record, now)
            if record.pair_id is not None:
                self.pairs.add(record, now)
        except Exception:  # the live view must never break a request
            log.exception("live view could not record a request")

    def publish_experiments(self, experiments: Mapping[str, Any]) -> None:
        """What `taotrace demo` ran, for the page's Demo tab (JSON-able)."""
        self.experiments = experiments

    async def requests(self, query: Query) -> dict[str, Any]:
        """`/api/requests`: the newest finished rows that match (newer than `query.since`), and
        the requests in flight now that match."""
        entries = self.ring.snapshot()
        chosen = select(entries, query)
        rows: list[dict[str, Any]] = []
        for start in range(0, len(chosen), ROWS_PER_SLICE):
            if start:
                await asyncio.sleep(0)  # let the proxy's streams run between slices
            rows.extend(row(e) for e in chosen[start : start + ROWS_PER_SLICE])
        apis, models = distinct(entries)
        running = [f for f in self.active(None) if running_matches(f, query)]
        return {
            "in_flight": [running_row(f) for f in reversed(running[-query.limit :])],  # newest first
            "requests": rows,
            "last_seq": self.ring.last_seq,
            "capacity": self.ring.capacity,
            "size": len(entries),
            "apis": apis,
            "models": models,
        }

    async def request(self, id_: str) -> dict[str, Any] | None:
        """`/api/requests/{id}`: one request, finished or in flight."""
        entry = self.ring.find(id_)
        if entry is not None:
            return detail(entry, trace_url=self.trace_url, capture_content=self.capture_content)
        running = self.active(id_)  # read now, with no wait between: it cannot finish meanwhile
        return running_detail(running[0]) if running else None

    async def pair(self, pair_id: str) -> dict[str, Any] | None:
        """`/api/pairs/{pair_id}`: a request and its mirror copy, and their differences."""
        primary, mirror = self.ring.find_pair(pair_id)
        if primary is None and mirror is None:
            return None
        url, content = self.trace_url, self.capture_content
        return {
            "pair_id": pair_id,
            "request": detail(primary, trace_url=url, capture_content=content) if primary else None,
            "mirror": detail(mirror, trace_url=url, capture_content=content) if mirror else None,
            "differences": differences(primary.record, mirror.record)
            if primary is not None and mirror is not None
            else None,
        }

    async def summary(self) -> dict[str, Any]:
        """`/api/summary`: the last 15 minutes, the pairs, the requests in flight, the demo's runs."""
        while not self.window.prepare(self.clock()):
            await asyncio.sleep(0)  # a full window's first percentiles, a few buckets per turn
        body = self.window.snapshot(self.clock())
        body["pairs"] = self.pairs.snapshot(self.clock())
        body["in_flight"] = self.in_flight()
        body["experiments"] = self.experiments
        return body
