"""The live view of a group (a `LiveSource`): each worker keeps its own (`proxy.ui.LiveView`), and
the supervisor asks them when the page polls, then merges what they answer.

    requests   each worker's newest rows that match, newer than what the page has of that worker
               (the page's `since` is a cursor minted here, mapping to each worker's own sequence
               number), merged newest first; the requests in flight likewise. A worker sends each
               row as its JSON, which is put in the answer as it came (never decoded here)
    request    the worker whose id it is (an untraced request's is `w<index>.<pid>-<its own
               id>`: the process that served it, while it lives), or each until one has it
               (a trace id)
    pair       each until one has it (a request and its mirror copy are served by one worker)
    summary    each worker's 15-minute buckets and matched pairs, merged as counts and histograms
               (`Window.merge`): percentiles are read from the merged histograms, as one window
               fed every request would give them

A worker that does not answer within the supervisor's wait is left out of that answer.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from operator import itemgetter
from typing import Any, Protocol

import orjson

from proxy.ui.pairs import Pairs
from proxy.ui.ring import Query
from proxy.ui.summary import Window

__all__ = ["CURSORS_KEPT", "GroupLive"]

CURSORS_KEPT = 16384  # `since` values the group remembers (a few entries each): one per state of the workers' rows


class Ask(Protocol):
    """The supervisor's question to its workers: (index, pid, answer) of each that answered."""

    def __call__(
        self,
        what: str,
        *,
        query: Callable[[int, int], Query] | None = None,
        key: str = "",
        only: int | None = None,
    ) -> Awaitable[list[tuple[int, int, Any]]]: ...


def untraced_id(index: int, pid: int, id_: str) -> str:
    """An untraced request's id in the group: its worker's own id (a sequence number, which a
    restarted worker counts afresh) under the worker's slot and process."""
    return f"w{index}.{pid}-{id_}"


def _worker_of(id_: str) -> tuple[int, int, str] | None:
    """(index, pid, the worker's own id) of an `untraced_id`; None for a trace id."""
    head, sep, own = id_.partition("-")
    index, dot, pid = head[1:].partition(".")
    if not (head.startswith("w") and sep and dot and index.isdigit() and pid.isdigit()):
        return None
    return int(index), int(pid), own


def _detail(index: int, pid: int, body: dict[str, Any] | None) -> dict[str, Any] | None:
    if body is not None and not body["record"].get("trace_id"):
        body["id"] = untraced_id(index, pid, body["id"])
    return body


class GroupLive:
    """A `LiveSource` for a group's metrics port."""

    def __init__(self, ask: Ask, capacity: int, clock: Callable[[], float] = time.time) -> None:
        self._ask = ask
        self._capacity = capacity
        self.clock = clock
        # cursor -> (worker index, pid) -> the last sequence number of that worker the page has;
        # and each state's cursor, so polls that find nothing new share one
        self._cursors: OrderedDict[int, dict[tuple[int, int], int]] = OrderedDict()
        self._minted_for: dict[frozenset[tuple[tuple[int, int], int]], int] = {}
        self._minted = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    async def requests(self, query: Query) -> dict[str, Any]:
        known = self._cursors.get(query.since) if query.since else {}
        # A cursor forgotten (or of another start): nothing new this time rather than rows twice.
        seen: dict[tuple[int, int], int] = {} if known is None else known
        forgotten = known is None

        def asked(index: int, pid: int) -> Query:
            since = 2**62 if forgotten else seen.get((index, pid), 0)
            return dataclasses.replace(query, since=since)

        answers = await self._ask("requests", query=asked)
        rows: list[tuple[float, bytes]] = []  # (finished, its JSON)
        running: list[tuple[float, bytes]] = []  # (started, its JSON)
        apis: set[str] = set()
        models: set[str] = set()
        size = 0
        # A slot that answered is known by its process now: an earlier process of it is gone.
        answered = {index for index, _, body in answers if body is not None}
        now = {key: n for key, n in seen.items() if key[0] not in answered}
        for index, pid, body in answers:
            if body is None:
                continue
            rows += body["requests"]
            running += body["in_flight"]
            apis.update(body["apis"])
            models.update(body["models"])
            size += body["size"]
            now[(index, pid)] = body["last_seq"]
        rows.sort(key=itemgetter(0), reverse=True)
        running.sort(key=itemgetter(0), reverse=True)
        return {
            "in_flight": [orjson.Fragment(r) for _, r in running[: query.limit]],
            "requests": [orjson.Fragment(r) for _, r in rows[: query.limit]],
            "last_seq": self._mint(now),
            "capacity": self._capacity,
            "size": min(size, self._capacity),
            "apis": sorted(apis),
            "models": sorted(models),
        }

    def _mint(self, seen: dict[tuple[int, int], int]) -> int:
        """The cursor of this state of the workers' rows: the one already made for it (kept as
        the newest), else a new one; the oldest forgotten past `CURSORS_KEPT`."""
        state = frozenset(seen.items())
        cursor = self._minted_for.get(state)
        if cursor is not None:
            self._cursors.move_to_end(cursor)
            return cursor
        self._minted += 1
        self._cursors[self._minted] = seen
        self._minted_for[state] = self._minted
        while len(self._cursors) > CURSORS_KEPT:
            _, old = self._cursors.popitem(last=False)
            self._minted_for.pop(frozenset(old.items()), None)
        return self._minted

    async def request(self, id_: str) -> dict[str, Any] | None:
        only = pid = None
        worker_of = _worker_of(id_)
        if worker_of is not None:  # an untraced request: only its worker knows it, while it lives
            only, pid, id_ = worker_of
        for index, answered_by, body in await self._ask("request", key=id_, only=only):
            if body is not None and pid in (None, answered_by):
                return _detail(index, answered_by, body)
        return None

    async def pair(self, pair_id: str) -> dict[str, Any] | None:
        for index, pid, body in await self._ask("pair", key=pair_id):
            if body is not None:
                body["request"] = _detail(index, pid, body["request"])
                body["mirror"] = _detail(index, pid, body["mirror"])
                return dict(body)
        return None

    async def summary(self) -> dict[str, Any]:
        window, pairs, in_flight = Window(), Pairs(), 0
        for _index, _pid, body in await self._ask("summary"):
            if body is not None:
                window.merge(body["window"])
                pairs.merge(body["pairs"])
                in_flight += body["in_flight"]
        now = self.clock()
        merged = window.snapshot(now)
        merged["pairs"] = pairs.snapshot(now)
        merged["in_flight"] = in_flight
        merged["experiments"] = None
        return merged
