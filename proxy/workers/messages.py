"""What the supervisor and a worker say to each other: one frozen class per message.

    worker -> supervisor   Hello    first, always: the worker's version (JSON, see channel.py)
                           Ready    serving
                           Report   its metrics' changes since its last report (`deltas.py`): every
                                    `REPORT_SECONDS`, and as the answer to an Ask for them
                           Answer   the answer to a live-view Ask
    supervisor -> worker   Start    after a Hello of this very version: settings, index, instance id, ...
                           Ask      /metrics is scraped (the changes now), or the live view's page
                                    polls (its rows, one request, a pair, its summary)

Every message but the Hello is a pickle, which is only safe between two processes that hold the
same classes with the same fields: a worker started from newer code after an in-place upgrade
would shift them silently in the old supervisor. The Hello carries `VERSION` and `SCHEMA` (a
digest of every field of every class that crosses the channel, and of `WIRE`, the way they are
written), and a supervisor refuses a worker whose Hello differs in either.
"""

from __future__ import annotations

import dataclasses
import hashlib
import typing
from dataclasses import dataclass
from typing import Any

from proxy import __version__
from proxy.ui.ring import Query
from proxy.workers.deltas import Taken

__all__ = ["SCHEMA", "VERSION", "WIRE", "Answer", "Ask", "Hello", "Ready", "Report", "Start", "ToSupervisor",
           "ToWorker", "schema"]  # fmt: skip

VERSION = __version__
# How messages are written (channel.py): 1 every message a pickle; 2 records as plain tuples in
# marshal, the rest pickles; 3 as 2, a long stream's series binned; 4 no records: every message a
# pickle, the metrics as changes. Part of SCHEMA: a worker writing another way is refused at its Hello.
WIRE = 4


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
    instance: str  # its `service.instance.id`, on its spans and OTLP metrics
    max_buffered: int  # bytes of unsent messages a worker holds before it holds its reports back


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker serves."""


@dataclass(frozen=True, slots=True)
class Report:
    """The worker's metrics' changes since its last report; `ask`: the Ask it answers (0: none)."""

    changes: Taken
    ask: int = 0


@dataclass(frozen=True, slots=True)
class Ask:
    """The supervisor's question number `ask`: `what` is "metrics" (a Report, now), or the live
    view's "requests" (with `query`), "request" or "pair" (with `key`), "summary"."""

    ask: int
    what: str
    query: Query | None = None
    key: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    """The live view's answer to the Ask numbered `ask` (JSON-able; None: not here)."""

    ask: int
    body: Any


ToWorker = Start | Ask
ToSupervisor = Ready | Report | Answer
_CROSSING = {"Query": Query}  # classes annotations name that their modules import only for type checking


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


SCHEMA = schema(Hello, Start, Ready, Report, Ask, Answer)
