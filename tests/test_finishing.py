"""`Finishing` (proxy/exchange/finishing.py): requests' bookkeeping done one per turn of the event loop, so
bytes readable on other connections are read between two requests' bookkeeping, on the loop the
proxy runs on (uvloop) and on asyncio's own."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
import uvloop

from proxy.exchange.finishing import Finishing

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


def _order(loop: asyncio.AbstractEventLoop, works: int, backlog: int = 64) -> list[str]:
    """Queue `works` callables, each making a socket readable; the order of works and reads."""
    a, b = socket.socketpair()
    a.setblocking(False)
    seen: list[str] = []
    finishing = Finishing(backlog)
    done = loop.create_future()

    def read() -> None:
        while True:
            try:
                if not a.recv(4096):
                    return
            except BlockingIOError:
                break
        seen.append("read")

    def work(i: int) -> Callable[[], None]:
        def run() -> None:
            seen.append(f"work{i}")
            b.send(b"x")  # bytes for the loop's next poll
            if i == works - 1:
                loop.call_later(0.05, done.set_result, None)

        return run

    async def main() -> None:
        loop.add_reader(a.fileno(), read)
        for i in range(works):
            finishing.add(work(i))
        assert len(finishing) == works
        await done
        loop.remove_reader(a.fileno())

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        a.close()
        b.close()
    return seen


@pytest.mark.parametrize("name", list(LOOPS))
def test_bookkeeping_runs_one_per_turn_with_reads_between(name: str) -> None:
    seen = _order(LOOPS[name](), 4)
    works = [s for s in seen if s != "read"]
    assert works == ["work0", "work1", "work2", "work3"]  # in the order queued
    # A byte a work wrote is read before the work after next runs (uvloop: before the next one).
    ahead = 1 if name == "uvloop" else 2
    for i in range(4 - ahead):
        assert "read" in seen[seen.index(f"work{i}") : seen.index(f"work{i + ahead}")], seen
    if name == "uvloop":
        assert seen == ["work0", "read", "work1", "read", "work2", "read", "work3", "read"]


def test_past_the_backlog_a_turn_runs_the_excess_too() -> None:
    # 6 queued, backlog 3: the first turn runs 3 (down to the backlog), then one per turn.
    seen = _order(LOOPS["uvloop"](), 6, backlog=3)
    assert seen[:4] == ["work0", "work1", "work2", "read"] and seen.count("read") == 4


def test_flush_runs_what_is_queued_and_the_scheduled_drain_finds_nothing() -> None:
    loop = uvloop.new_event_loop()
    ran: list[int] = []

    async def main() -> None:
        finishing = Finishing()
        for i in range(3):
            finishing.add(lambda i=i: ran.append(i))  # type: ignore[misc]
        finishing.flush()
        assert ran == [0, 1, 2] and len(finishing) == 0
        await asyncio.sleep(0.01)  # the drain scheduled by the first add runs on an empty queue
        finishing.add(lambda: ran.append(3))
        await asyncio.sleep(0.01)
        assert ran == [0, 1, 2, 3]

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
