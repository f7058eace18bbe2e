"""Rate limiting for log lines, pure: the clock is passed in, nothing here logs or sleeps.

The first line of a kind goes out at once; later ones within `interval` are only counted, and
`due()` hands back each count once its interval has ended, for one summary line ("… (37 more in
the last 60 s)"). A steady stream of failures thus costs one line per interval per kind; a kind
quiet for a whole interval is forgotten, so its next line goes out at once again.

Kinds must come from a bounded set (callers use the line's text, built from a fixed vocabulary):
the table keeps one entry per kind seen in the last interval or two.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["LogLimiter", "Repeats"]

K = TypeVar("K", bound=Hashable)
Clock = Callable[[], float]


@dataclass(frozen=True)
class Repeats(Generic[K]):
    """`count` more lines of `kind` came in the `seconds` since the last one that went out."""

    kind: K
    count: int
    seconds: float


class _Window:
    __slots__ = ("count", "start")

    def __init__(self, start: float) -> None:
        self.start = start  # when the last line of this kind went out (or was summarised)
        self.count = 0  # lines held back since then


class LogLimiter(Generic[K]):
    """Decides which lines of each kind go out; `due()` must be called at least once an interval."""

    def __init__(self, interval: float, clock: Clock) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.interval = interval
        self._clock = clock
        self._windows: dict[K, _Window] = {}

    def admit(self, kind: K) -> bool:
        """True: log this line now. False: it is counted, and reported by a later `due()`."""
        now = self._clock()
        window = self._windows.get(kind)
        if window is None:
            self._windows[kind] = _Window(now)
            return True
        if window.count == 0 and now - window.start >= self.interval:
            window.start = now  # quiet since its last line for a whole interval: no count to report
            return True
        window.count += 1
        return False

    def due(self) -> list[Repeats[K]]:
        """The counts whose interval has ended, each reported once; their kinds start a new interval
        (still counted, so a steady stream gives one summary an interval). Kinds that were quiet
        for the whole interval are forgotten."""
        now = self._clock()
        out: list[Repeats[K]] = []
        for kind, window in list(self._windows.items()):
            if now - window.start < self.interval:
                continue
            if window.count == 0:
                del self._windows[kind]
                continue
            out.append(Repeats(kind, window.count, now - window.start))
            window.start, window.count = now, 0
        return out

    def pending(self) -> list[Repeats[K]]:
        """Every count not reported yet, whether its interval has ended or not (at exit); the table
        is emptied."""
        now = self._clock()
        out = [Repeats(kind, w.count, now - w.start) for kind, w in self._windows.items() if w.count]
        self._windows.clear()
        return out
