"""What runs now, in one place: every request in flight in this process.

    tasks       each request's handler task, from its first byte (the drain waits for them and
                cancels those left at its deadline)
    exchanges   each request (and `--mirror` copy) being forwarded, from its dialect's reading to
                its bookkeeping: the live view reads them when it polls, the in-flight gauge
                counts the requests among them, the bookkeeping queue asks whether any still run
    draining    a drain has begun: /readyz says 503, a request cut now is `shutdown`

Nothing is computed while bytes flow: the live view asks each exchange for an `InFlight` made of
what its phase clock and relay already hold, and only when someone looks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["PHASES", "Counted", "InFlight", "InFlightExchange", "InFlightRequests"]

log = logging.getLogger("taotrace")


# The phase a running request has reached: writing the request (network), waiting for the
# response head (headers), a stream open with no token yet (prefill_wait), tokens arriving
# (decode; `thinking` while the last of them was a reasoning model's reasoning), or a response
# that is not a stream arriving (response).
PHASES = ("network", "headers", "prefill_wait", "decode", "thinking", "response")


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
    first_answer: float | None = None  # a reasoning model's answer's first token, once it came


class InFlightExchange(Protocol):
    """What the registry holds: an exchange that can describe itself (`proxy.exchange.exchange`)."""

    mirror: bool
    task: asyncio.Task[Any] | None

    def in_flight(self, now: float, wall: float, gaps: bool) -> InFlight: ...


class Counted(Protocol):
    """The in-flight gauge's child for one (upstream, api): what `InFlightRequests` counts requests in."""

    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


class InFlightRequests:
    """The requests in flight in this process (see the module's docstring)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, wall_clock: Callable[[], float] = time.time):
        self.tasks: set[asyncio.Task[Any]] = set()
        self._exchanges: set[InFlightExchange] = set()
        self.draining = False
        self.clock = clock  # the handler's clock: the phase clocks' instants are on it
        self.wall_clock = wall_clock

    def __len__(self) -> int:
        """Exchanges between their start and their bookkeeping (mirror copies included)."""
        return len(self._exchanges)

    def add(self, x: InFlightExchange, counted: Counted | None = None) -> None:
        """`x` starts; `counted`: its gauge child (a request; a mirror copy is not counted)."""
        self._exchanges.add(x)
        if counted is not None:
            counted.inc()

    def discard(self, x: InFlightExchange, counted: Counted | None = None) -> None:
        self._exchanges.discard(x)
        if counted is not None:
            counted.dec()

    def mirror_tasks(self) -> list[asyncio.Task[Any]]:
        """The `--mirror` copies running: no client waits for them, so a stop cancels them."""
        return [x.task for x in self._exchanges if x.mirror and x.task is not None]

    def snapshot(self, want: str | None = None) -> list[InFlight]:
        """Every request in flight, oldest first; with `want`, only that one, with its gaps."""
        now, wall = self.clock(), self.wall_clock()
        out = []
        for x in list(self._exchanges):
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
