"""A group's live view (proxy/workers/live.py) against workers that answer as the real ones do
(`proxy.workers.worker._rows` names their rows): ids stay unique across a worker's restart, and
the page's cursors forget the processes that are gone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from proxy.ui.ring import Query
from proxy.workers.live import GroupLive
from proxy.workers.worker import _rows


def _row(seq: int, finished: float) -> dict[str, Any]:
    return {"id": str(seq), "seq": seq, "time": finished, "trace_id": None}


class Slots:
    """Each slot's process (its pid) and the rows its live view keeps, answering `requests` and
    `request` as a worker does."""

    def __init__(self) -> None:
        self.pids = {0: 100}
        self.rows: dict[int, list[dict[str, Any]]] = {0: []}

    async def ask(
        self, what: str, *, query: Callable[[int, int], Query] | None = None, key: str = "", only: int | None = None
    ) -> list[tuple[int, int, Any]]:
        out: list[tuple[int, int, Any]] = []
        for index, pid in self.pids.items():
            if only is not None and index != only:
                continue
            kept = self.rows[index]
            if what == "request":
                found = [r for r in kept if r["id"] == key]
                out.append((index, pid, {"id": key, "record": {"trace_id": None}} if found else None))
                continue
            assert query is not None
            q = query(index, pid)
            new = [dict(r) for r in reversed(kept) if r["seq"] > q.since][: q.limit]
            body = {
                "requests": _rows(new, "time", index, pid),
                "in_flight": [],
                "apis": [],
                "models": [],
                "size": len(kept),
                "last_seq": max((r["seq"] for r in kept), default=0),
            }
            out.append((index, pid, body))
        return out


def _ids(body: dict[str, Any]) -> list[str]:
    return [r["id"] for r in orjson.loads(orjson.dumps(body))["requests"]]


async def test_an_untraced_id_is_never_reused_by_a_restarted_worker() -> None:
    slots = Slots()
    live = GroupLive(slots.ask, 100)
    slots.rows[0] = [_row(1, 1.0), _row(2, 2.0)]
    first = await live.requests(Query(limit=100))
    slots.pids[0], slots.rows[0] = 200, [_row(1, 3.0)]  # the worker died; its successor counts from 1
    second = await live.requests(Query(limit=100, since=first["last_seq"]))
    ids = _ids(first) + _ids(second)
    assert ids == ["w0.100-2", "w0.100-1", "w0.200-1"]
    assert (await live.request("w0.200-1")) == {"id": "w0.200-1", "record": {"trace_id": None}}
    assert await live.request("w0.100-1") is None  # the dead process's row: not its successor's request 1


async def test_cursors_forget_the_processes_that_are_gone() -> None:
    slots = Slots()
    live = GroupLive(slots.ask, 100)
    since = 0
    for pid in range(1000, 1200):  # worker 0 restarted 200 times while a page polls
        slots.pids[0] = pid
        since = (await live.requests(Query(limit=100, since=since)))["last_seq"]
    newest = await live.requests(Query(limit=100, since=since))
    assert newest["requests"] == [] and newest["last_seq"] == since  # nothing new: the same cursor
    assert len(live._cursors[newest["last_seq"]]) == 1  # private: what each cursor holds, one process per slot


async def test_a_cursor_outlives_any_number_of_polls_that_find_nothing_new() -> None:
    """A slow poller's `since` still works after other pages polled thousands of times."""
    slots = Slots()
    live = GroupLive(slots.ask, 100)
    slots.rows[0] = [_row(1, 1.0)]
    mine = (await live.requests(Query(limit=1)))["last_seq"]
    slots.rows[0] += [_row(2, 2.0), _row(3, 3.0)]
    for _ in range(20_000):  # other pages, polling
        await live.requests(Query(limit=1))
    assert _ids(await live.requests(Query(limit=100, since=mine))) == ["w0.100-3", "w0.100-2"]
