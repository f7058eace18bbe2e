"""The recent requests the live view shows: a bounded ring of finished records. Pure.

Each entry keeps the `RequestRecord` the spans and metrics were made from, so the page shows
the same numbers as the trace. Only the per-gap series are bounded: a stream with more than
`MAX_GAPS` inter-token gaps keeps, for each run of k consecutive gaps, the largest (a stall
stays visible); other series the view does not show (`chunk_gaps`) are dropped when longer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, Generic, TypeVar

from proxy.exchange.record import RequestRecord, model_label
from proxy.exchange.timing import RequestTiming

__all__ = ["MAX_GAPS", "SERIES", "Entry", "Query", "Ring", "compact_gaps", "distinct", "parse_query", "select"]

DEFAULT_LIMIT = 100
MAX_GAPS = 256  # bars of a stream's gaps the live view keeps (the largest of each run of k gaps)
# The per-token or per-chunk series of a RequestTiming: one float per gap or read, so the only
# parts of a record whose size grows with the stream (thinking_spans is bounded where it is made).
SERIES = ("itl", "chunk_gaps", "relay")

T = TypeVar("T")


class _Replacer(Generic[T]):
    """`dataclasses.replace` for one frozen slots dataclass, without `__init__` and without its
    walk over the fields (a long stream's record is copied twice, so the walk would be paid twice)."""

    def __init__(self, cls: type[T]) -> None:
        names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
        self._cls = cls
        self._get = attrgetter(*names)
        self._index = {name: i for i, name in enumerate(names)}
        self._setters = tuple(getattr(cls, name).__set__ for name in names)  # the slots' descriptors

    def __call__(self, obj: T, changes: Mapping[str, Any]) -> T:
        values = list(self._get(obj))
        for name, value in changes.items():
            values[self._index[name]] = value
        new = object.__new__(self._cls)
        for set_field, value in zip(self._setters, values, strict=True):
            set_field(new, value)
        return new


def compact_gaps(itl: tuple[float, ...], cap: int) -> tuple[tuple[float, ...], int]:
    """At most `cap` gaps: the largest of each run of k consecutive ones, and k."""
    n = len(itl)
    if n <= cap:
        return itl, 1
    k = -(-n // cap)
    full = n - n % k
    out = list(map(max, zip(*[iter(itl[:full])] * k, strict=True)))  # C loops: no Python step per gap
    if full < n:
        out.append(max(itl[full:]))
    return tuple(out), k


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One finished request as the live view keeps it."""

    seq: int  # 1, 2, ... in order of finishing
    time: float  # wall clock (Unix seconds) when it finished
    record: RequestRecord  # timing.itl compacted when longer than MAX_GAPS
    gaps_per_bar: int = 1  # each kept gap is the largest of this many consecutive gaps

    @property
    def id(self) -> str:
        """The trace id, or the sequence number for a request that was not traced."""
        return self.record.trace_id or str(self.seq)


class Ring:
    """The last `capacity` finished requests, oldest dropped first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: deque[Entry] = deque(maxlen=capacity)
        self._seq = 0
        self._series = attrgetter(*SERIES)  # two names or more: it always returns a tuple
        self._timing_with = _Replacer(RequestTiming)
        self._record_with = _Replacer(RequestRecord)

    def add(self, record: RequestRecord, now: float) -> Entry:
        timing = record.timing
        k = 1
        if max(map(len, self._series(timing))) > MAX_GAPS:  # long streams only; they already cost far more per token
            changes: dict[str, Any] = {}
            for name in SERIES:
                values = getattr(timing, name)
                if name == "itl":
                    changes[name], k = compact_gaps(values, MAX_GAPS)
                elif len(values) > MAX_GAPS:
                    changes[name] = ()  # not shown by the view: not worth a copy
            if changes:
                record = self._record_with(record, {"timing": self._timing_with(timing, changes)})
        self._seq += 1
        entry = Entry(seq=self._seq, time=now, record=record, gaps_per_bar=k)
        self._entries.append(entry)
        return entry

    @property
    def last_seq(self) -> int:
        return self._seq

    def __len__(self) -> int:
        return len(self._entries)

    def snapshot(self) -> list[Entry]:
        """Oldest first; a copy, so the caller may read it while new requests land."""
        return list(self._entries)

    def find(self, id_: str) -> Entry | None:
        for entry in reversed(self._entries):
            if entry.record.trace_id == id_ or (entry.record.trace_id is None and str(entry.seq) == id_):
                return entry
        return None

    def find_pair(self, pair_id: str) -> tuple[Entry | None, Entry | None]:
        """The request and its mirror copy sharing `pair_id` (None for a half not kept, or not
        finished yet)."""
        request = mirror = None
        for entry in reversed(self._entries):
            if entry.record.pair_id == pair_id:
                if entry.record.mirror:
                    mirror = entry
                else:
                    request = entry
                if request is not None and mirror is not None:
                    break
        return request, mirror


@dataclass(frozen=True, slots=True, kw_only=True)
class Query:
    """A filter over the ring, from `/api/requests`' query string."""

    limit: int = DEFAULT_LIMIT
    api: str | None = None
    model: str | None = None
    errors: bool = False  # only requests with an error_type
    slow: float | None = None  # only requests whose TTFT (or, without one, duration) is at least this many seconds
    since: int = 0  # only entries with a larger seq (the page's incremental poll)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def _flag(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name} must be true or false, got {raw[:40]!r}")


def _number(name: str, raw: str, kind: type[int] | type[float], low: float, high: float) -> float:
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw[:40]!r}") from None
    if not low <= value <= high:  # also rejects nan
        raise ValueError(f"{name} must be between {low:g} and {high:g}, got {raw[:40]!r}")
    return value


def parse_query(params: Mapping[str, str], capacity: int) -> Query:
    """Validate the parameters; ValueError with a message fit for a 400 answer."""
    unknown = sorted(set(params) - {"limit", "api", "model", "errors", "slow", "since"})
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0][:40]!r}: use limit, api, model, errors, slow, since")
    limit = params.get("limit")
    slow = params.get("slow")
    since = params.get("since")
    return Query(
        limit=int(_number("limit", limit, int, 1, capacity)) if limit else min(DEFAULT_LIMIT, capacity),
        api=params.get("api") or None,
        model=params.get("model") or None,
        errors=_flag("errors", params.get("errors", "")),
        slow=_number("slow", slow, float, 0.0, 86400.0) if slow else None,
        since=int(_number("since", since, int, 0, 2**62)) if since else 0,
    )


def _matches(entry: Entry, q: Query) -> bool:
    r = entry.record
    if entry.seq <= q.since:
        return False
    if q.api is not None and r.api != q.api:
        return False
    if q.model is not None and model_label(r.model) != q.model:  # `?model=unknown`: those that named none
        return False
    if q.errors and not r.error_type:
        return False
    if q.slow is not None:
        t = r.timing
        if (t.ttft if t.ttft is not None else t.duration) < q.slow:
            return False
    return True


def select(entries: Sequence[Entry], q: Query) -> list[Entry]:
    """The newest `q.limit` entries that match, newest first."""
    found: list[Entry] = []
    for entry in reversed(entries):
        if entry.seq <= q.since:
            break  # entries are in seq order
        if _matches(entry, q):
            found.append(entry)
            if len(found) >= q.limit:
                break
    return found


def distinct(entries: Iterable[Entry]) -> tuple[list[str], list[str]]:
    """The apis and models present (`unknown` among them when a request named none), for the
    page's filter menus."""
    apis = {e.record.api for e in entries}
    models = {model_label(e.record.model) for e in entries}
    return sorted(apis), sorted(models)
