"""Requests being forwarded now, for the live view: read when someone asks, never per event.

The Forwarder registers each exchange as it starts and removes it as it ends (a set add and a
discard); `InFlightRequests.snapshot` then asks each for an `InFlight` made of what its phase
clock and relay already hold. Nothing is computed while bytes flow, and nothing at all when
nobody looks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["PHASES", "InFlight", "InFlightRequests", "Running"]

log = logging.getLogger("taotrace")

# The phase a running request has reached: writing the request (network), waiting for the
# response head (headers), a stream open with no token yet (prefill_wait), tokens arriving
# (decode), or a response that is not a stream arriving (response).
PHASES = ("network", "headers", "prefill_wait", "decode", "response")


@dataclass(frozen=True, slots=True, kw_only=True)
class InFlight:
    """One request still running, `elapsed` seconds after its head arrived; times are seconds
    from that start, None where the moment has not come yet."""

    id: str  # the trace id, or a key of its own while it runs
    trace_id: str | None
    api: str
    operation: str | None
    model: str | None
    method: str
    stream: bool  # a stream was asked for, or is arriving
    upstream: str  # the route's name ("" without --route)
    started: float  # wall clock (Unix seconds)
    elapsed: float
    phase: str  # one of PHASES
    status: int | None  # the upstream's status, once its head arrived
    network: float | None
    time_to_headers: float | None
    ttfb: float | None
    ttft: float | None
    last_token: float | None
    last_byte: float | None  # the last bytes written to the client so far
    output_tokens: int  # token events so far
    gaps: tuple[float, ...] = ()  # inter-token gaps so far: only when one request is asked for


class Running(Protocol):
    """What the registry holds: an exchange that can describe itself (`proxy.exchange.forward`)."""

    def in_flight(self, now: float, wall: float, gaps: bool) -> InFlight: ...


class InFlightRequests:
    """The exchanges in flight in this process."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, wall_clock: Callable[[], float] = time.time):
        self._running: set[Running] = set()
        self.clock = clock  # the Forwarder's clock: the phase clocks' instants are on it
        self.wall_clock = wall_clock
        self.add = self._running.add
        self.discard = self._running.discard

    def __len__(self) -> int:
        return len(self._running)

    def snapshot(self, want: str | None = None) -> list[InFlight]:
        """Every request in flight, oldest first; with `want`, only that one, with its gaps."""
        now, wall = self.clock(), self.wall_clock()
        out = []
        for x in list(self._running):
            try:
                found = x.in_flight(now, wall, False)
                if want is not None:
                    if found.id != want:
                        continue
                    found = x.in_flight(now, wall, True)
            except Exception:  # the view must never break a request, nor one request the view
                log.exception("live view could not read a request in flight")
                continue
            out.append(found)
        out.sort(key=lambda f: f.started)
        return out

    async def ask(self, want: str | None = None) -> list[InFlight]:
        """`snapshot` as the live view calls it (a group's supervisor has to ask its workers)."""
        return self.snapshot(want)
