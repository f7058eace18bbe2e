"""What the supervisor and a worker say to each other: one frozen class per message.

    worker -> supervisor   Hello            first, always: the worker's version (JSON, see channel.py)
                           Ready            serving
                           Records          finished requests, in-flight counts, records dropped so far
                           InFlightAnswer   the answer to an AskInFlight
    supervisor -> worker   Start            after a Hello of this very version: settings, index, ...
                           AskInFlight      the live view polls: what runs now (one request, or all)

Records cross as plain tuples of their fields by position (`record_form`, see channel.py), the
other messages as pickles: both are only safe between two processes that hold the same classes
with the same fields, since a worker started from newer code after an in-place upgrade would
shift them silently in the old supervisor. The Hello carries `VERSION` and `SCHEMA` (a digest of
every field of every class that crosses the channel, and of `WIRE`, the way they are written),
and a supervisor refuses a worker whose Hello differs in either.
"""

from __future__ import annotations

import dataclasses
import hashlib
import typing
from dataclasses import dataclass, field
from typing import Any

from proxy import __version__
from proxy.accounting.prices import Cost
from proxy.accounting.ratelimits import RateLimit, RateLimits
from proxy.dialects import Usage
from proxy.exchange.inflight import InFlight
from proxy.exchange.record import RequestRecord, SpanStart
from proxy.exchange.timing import RequestTiming
from proxy.upstream.tcpinfo import TcpStats
from proxy.workers.plain import Plain

__all__ = [
    "SCHEMA",
    "VERSION",
    "WIRE",
    "AskInFlight",
    "Hello",
    "InFlightAnswer",
    "Ready",
    "Records",
    "Start",
    "ToSupervisor",
    "ToWorker",
    "record_form",
    "schema",
]

VERSION = __version__
# How messages are written (channel.py): 1 every message a pickle; 2 records as plain tuples in
# marshal, the rest pickles; 3 as 2, a long stream's series binned (binning.py). Part of SCHEMA: a
# worker writing another way is refused at its Hello.
WIRE = 3


@dataclass(frozen=True, slots=True)
class Hello:
    """A worker's first words: which code it runs (refused unless it is the supervisor's own)."""

    version: str
    schema: str
    pid: int


@dataclass(frozen=True, slots=True)
class Start:
    """The supervisor's answer to an accepted Hello: how to serve."""

    settings: dict[str, Any]  # `Settings.model_dump()`, the group's salt included
    index: int
    ship_spans: bool  # start each span and ship it in the record: the supervisor exports spans
    max_buffered: int  # bytes of unsent messages a worker holds before it drops records


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker serves."""


@dataclass(frozen=True, slots=True)
class Records:
    """Finished requests, the worker's in-flight counts now, and the records (and `--mirror`
    copies) it dropped and its sinks failed on so far."""

    records: list[RequestRecord]
    in_flight: dict[tuple[str, ...], float]  # (upstream, api) -> requests in flight
    dropped: int  # since the worker started: the supervisor counts the difference
    sink_errors: dict[str, float]  # sink -> records it failed on since the worker started (likewise)
    # --mirror copies a cap refused since the worker started, by reason (per_minute, concurrency)
    mirror_dropped: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AskInFlight:
    """The live view's question: every request in flight (`want` None), or that one."""

    ask: int
    want: str | None


@dataclass(frozen=True, slots=True)
class InFlightAnswer:
    """What runs in the worker now, for the AskInFlight numbered `ask`."""

    ask: int
    requests: list[InFlight]


ToWorker = Start | AskInFlight
ToSupervisor = Ready | Records | InFlightAnswer

# The classes whose instances cross the channel inside messages, by name, for `schema`: some are
# imported only for type checking where they are used as field types.
_CROSSING = {c.__name__: c for c in (RequestRecord, RequestTiming, SpanStart, Usage, TcpStats, Cost, RateLimit,
                                     RateLimits, InFlight)}  # fmt: skip


def _dataclasses_in(hint: object) -> list[type]:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return [hint]
    return [found for arg in typing.get_args(hint) for found in _dataclasses_in(arg)]


def schema(*roots: type, wire: int = WIRE) -> str:
    """A digest of the fields (names, types, order) of `roots` and of every dataclass they hold,
    written the `wire` way."""
    seen: dict[str, str] = {"wire": str(wire)}
    todo = list(roots)
    while todo:
        cls = todo.pop()
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in seen:
            continue
        hints = typing.get_type_hints(cls, localns=_CROSSING)
        fields = dataclasses.fields(cls)
        seen[name] = ",".join(f"{f.name}:{hints[f.name]!r}" for f in fields)
        for f in fields:
            todo += _dataclasses_in(hints[f.name])
    text = "\n".join(f"{name}({fields})" for name, fields in sorted(seen.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


SCHEMA = schema(Hello, Start, Ready, Records, AskInFlight, InFlightAnswer)
record_form: Plain[RequestRecord] = Plain(RequestRecord, localns=_CROSSING)
"""A record as the tuple it crosses the channel in, and back."""
