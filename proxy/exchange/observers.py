"""The consumers of finished requests, behind one guard. Every record goes to each observer
(metrics, spans, the live view, the access log, the OTLP GenAI metrics, …) in
turn, as `logging.Logger.callHandlers` runs each handler: an observer that raises is logged
(rate-limited, with its stack) and counted in `taotrace_sink_errors_total{sink}`, and the ones
after it still run. Telemetry never breaks, slows or stalls a request, nor one observer another;
the exchange knows none of them by name.

An observer's name is its label value: a fixed word per kind (`metrics`, `spans`, `live_view`,
`access_log`, `genai_metrics`, …), so the label stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from proxy.logs.ratelimited import RateLimitedLog
from proxy.logs.stack import stack_of

__all__ = ["ErrorCounts", "Named", "Observers"]

R = TypeVar("R")


class _Count(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class ErrorCounts(Protocol):
    """`taotrace_sink_errors_total`: one child per observer's name."""

    def labels(self, *values: str) -> _Count: ...


@dataclass(frozen=True, slots=True)
class Named(Generic[R]):
    """An observer and the word it is counted under."""

    name: str
    sink: Callable[[R], None]


class Observers(Generic[R]):
    """Runs observers, each in its own guard; `failed` counts and logs one that raised."""

    def __init__(
        self, sinks: Sequence[Named[R]], errors: ErrorCounts, log: RateLimitedLog, more: Iterable[str] = ()
    ) -> None:
        """`more`: names of steps the caller guards itself through `failed` (reading a request,
        building its record), so their counters exist from the start too."""
        self._sinks = tuple((s.name, s.sink) for s in sinks)
        self._errors = errors
        self._log = log
        self._counts: dict[str, _Count] = {}
        for name in (*more, *(name for name, _ in self._sinks)):
            self._counts[name] = errors.labels(name)  # 0 from the start: alerts can use it

    def __call__(self, record: R) -> None:
        """Hand `record` to every observer, in order."""
        for name, sink in self._sinks:
            try:
                sink(record)
            except Exception as exc:  # noqa: BLE001 - counted and logged: one observer never starves the next
                self.failed(name, exc)

    def failed(self, name: str, exc: BaseException) -> None:
        """Observer `name` raised `exc`: count it, and log it (the first of a kind at once, then a
        count per interval). Never raises."""
        try:
            count = self._counts.get(name)
            if count is None:
                count = self._counts[name] = self._errors.labels(name)
            count.inc()
            self._log.warning(f"the {name} sink failed on a request record: {stack_of(exc)}")
        except Exception:  # noqa: BLE001 - reporting a failure must not become one
            pass
