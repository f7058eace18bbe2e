"""Each finished request's record goes to several sinks (metrics, spans, the live view, …), each
in its own guard, as `logging.Logger.callHandlers` runs each handler: a sink that raises is
logged (rate-limited, with its stack) and counted in `taotrace_sink_errors_total{sink}`, and the
sinks after it still run. Telemetry never breaks, slows or stalls a request, nor one sink another.

A sink's name is its label value: a fixed word per kind of sink (`metrics`, `spans`,
`live_view`, `access_log`, `genai_metrics`, `workers_ship`, …), so the label stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from proxy.logs.ratelimited import RateLimitedLog
from proxy.logs.stack import stack_of
from proxy.telemetry.exposition import Counter, ValueChild

__all__ = ["Named", "Sinks"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Named(Generic[R]):
    """A sink and the word it is counted under."""

    name: str
    sink: Callable[[R], None]


class Sinks(Generic[R]):
    """Runs sinks, each in its own guard; `failed` counts and logs one that raised."""

    def __init__(self, sinks: Sequence[Named[R]], errors: Counter, log: RateLimitedLog, more: Iterable[str] = ()):
        """`more`: names of sinks the caller runs itself through `failed` (e.g. one that takes
        more than the record), so their counters exist from the start too."""
        self._sinks = tuple((s.name, s.sink) for s in sinks)
        self._errors = errors
        self._log = log
        self._counts: dict[str, ValueChild] = {}
        for name in (*more, *(name for name, _ in self._sinks)):
            self._counts[name] = errors.labels(name)  # 0 from the start: alerts can use it

    def __call__(self, record: R) -> None:
        """Hand `record` to every sink, in order."""
        for name, sink in self._sinks:
            try:
                sink(record)
            except Exception as exc:  # noqa: BLE001 - counted and logged: one sink never starves the next
                self.failed(name, exc)

    def failed(self, name: str, exc: BaseException) -> None:
        """Sink `name` raised `exc`: count it, and log it (the first of a kind at once, then a
        count per interval). Never raises."""
        try:
            count = self._counts.get(name)
            if count is None:
                count = self._counts[name] = self._errors.labels(name)
            count.inc()
            self._log.warning(f"the {name} sink failed on a request record: {stack_of(exc)}")
        except Exception:  # noqa: BLE001 - reporting a failure must not become one
            pass
