"""When the fake upstream wrote each frame and when the client had it, on the proxy's own clock.

The proxy times phases with `time.perf_counter` (CLOCK_MONOTONIC on Linux: one clock for every
process on the machine, workers included). A frame cannot reach the proxy before the upstream
wrote it, nor the client before the proxy read it, so each instant the proxy records lies
between the upstream's write stamp and the client's receive stamp of the same bytes, however
loaded the machine is. Tests bracket the record by those stamps instead of by the schedule
the upstream was asked to keep (a sleep on a loaded machine wakes late).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from tests.fakes import Handler

__all__ = ["Stamps", "read_stamped", "scheduled_handler"]

clock = time.perf_counter  # the proxy's clock (proxy/exchange/forward.py)


@dataclass
class Stamps:
    """`sent`: the client's request about to go; `entered`: the upstream's handler entered;
    `writes[i]`: the upstream about to write frame i; `received[i]`: the client holding frame i whole."""

    sent: float = 0.0
    entered: float = 0.0
    writes: list[float] = field(default_factory=list)
    received: list[float] = field(default_factory=list)

    def between(self, t: float | None, frame: int) -> bool:
        """Whether the proxy's instant `t` for frame `frame` lies between its write and its receipt."""
        return t is not None and self.writes[frame] <= t <= self.received[frame]


def scheduled_handler(frames: Sequence[bytes], delays: Sequence[float], stamps: Stamps) -> Handler:
    """An SSE upstream that sleeps `delays[i]`, then writes `frames[i]`, stamping each write."""

    async def handler(request: web.Request) -> web.StreamResponse:
        stamps.entered = clock()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame, delay in zip(frames, delays, strict=True):
            await asyncio.sleep(delay)
            stamps.writes.append(clock())
            await resp.write(frame)
        await resp.write_eof()
        return resp

    return handler


async def read_stamped(resp: aiohttp.ClientResponse, frames: Sequence[bytes], stamps: Stamps) -> bytes:
    """The whole body, stamping the read that completed each frame (the proxy relays bytes as sent)."""
    ends = []
    total = 0
    for frame in frames:
        total += len(frame)
        ends.append(total)
    body = b""
    async for chunk in resp.content.iter_any():
        now = clock()
        body += chunk
        while len(stamps.received) < len(ends) and len(body) >= ends[len(stamps.received)]:
            stamps.received.append(now)
    return body
