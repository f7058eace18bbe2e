"""The live view's state: fed each finished record as one of the observers (`proxy/exchange/observers.py`).

`observe` runs on the event loop once per request, at finish, after the client has its last
byte: an append to the ring and a few counter updates (its cost: docs/live-view.md).
Requests still running are not kept here: `active` asks for them when the page polls (this
process's `InFlightRequests`, or a group's supervisor asking its workers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from proxy.exchange.inflight import InFlight
from proxy.exchange.record import RequestRecord
from proxy.ui.pairs import Pairs
from proxy.ui.ring import Ring
from proxy.ui.summary import Window

__all__ = ["Active", "LiveView"]

# The requests in flight now (all, or the one with that id, with its gaps).
Active = Callable[[str | None], Awaitable[Sequence[InFlight]]]


async def _none(_want: str | None) -> Sequence[InFlight]:
    return ()


log = logging.getLogger("taotrace")


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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ring = Ring(capacity)
        self.window = Window()
        self.pairs = Pairs()
        self.in_flight = in_flight
        self.active = active
        self.capture_content = capture_content
        self.clock = clock
        self.experiments: Mapping[str, Any] | None = None

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
