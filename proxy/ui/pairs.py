"""Pairs (`--mirror`): a request and its mirror copy, matched by their shared pair id. Pure; the
caller owns the clock.

`differences` is what the pair view and the overview show, always mirror − request. `Pairs`
matches the two records of each pair as they finish (either may end first; an unmatched one
waits, at most `MAX_PENDING` at once, oldest forgotten first) and keeps the pairs matched in the
last 15 minutes, at most `MAX_PAIRS`, for `/api/summary`. Route names are the operator's, so
the groups (request's route, mirror's route) are few. Both halves of a pair are served by one
process (a worker copies the requests it serves), so a group's summary merges each worker's
matched pairs (`state`, `merge`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from typing import Any

from proxy.exchange.record import RequestRecord

__all__ = ["MAX_PAIRS", "MAX_PENDING", "MatchedState", "Pairs", "differences", "outcome"]

MAX_PENDING = 1024  # records waiting for the other half (copies run at most --mirror-concurrency at once)
MAX_PAIRS = 5000  # matched pairs kept for the window (the per-minute cap keeps real use far below)
WINDOW_S = 900.0


def outcome(r: RequestRecord) -> str:
    """The outcome: "ok", or the record's error type."""
    return r.error_type or "ok"


def _minus(a: float | int | None, b: float | int | None) -> float | int | None:
    return None if a is None or b is None else a - b


def _rtt(r: RequestRecord) -> float | None:
    return r.tcp.round_trip if r.tcp is not None else None


def differences(request: RequestRecord, mirror: RequestRecord) -> dict[str, Any]:
    """Mirror − request for each measure both have (None where either lacks it), and both outcomes."""
    rt, mt = request.timing, mirror.timing
    return {
        "ttft": _minus(mt.ttft, rt.ttft),
        "tpot": _minus(mt.tpot, rt.tpot),
        "duration": _minus(mt.duration, rt.duration),
        "output_tokens": _minus(mirror.usage.output_tokens, request.usage.output_tokens),
        "rtt": _minus(_rtt(mirror), _rtt(request)),
        "outcome": {"request": outcome(request), "mirror": outcome(mirror)},
    }


@dataclass(frozen=True, slots=True)
class _Matched:
    time: float  # when the second half finished
    upstream: str  # the request's route
    mirror: str  # the mirror's route
    ttft: float | None  # mirror − request, when both answered without error
    tpot: float | None
    request_ok: bool
    mirror_ok: bool


# A matched pair as plain values: the fields of `_Matched`, in order.
MatchedState = tuple[float, str, str, "float | None", "float | None", bool, bool]


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


class Pairs:
    """The pairs of the last 15 minutes, matched from the records of both halves."""

    def __init__(self, window_s: float = WINDOW_S, max_pairs: int = MAX_PAIRS, max_pending: int = MAX_PENDING):
        self.window_s = window_s
        self.max_pending = max_pending
        self._pending: OrderedDict[str, RequestRecord] = OrderedDict()
        self._matched: deque[_Matched] = deque(maxlen=max_pairs)

    def add(self, record: RequestRecord, now: float) -> None:
        """One half of a pair (a record without a pair id is ignored)."""
        pair_id = record.pair_id
        if pair_id is None:
            return
        other = self._pending.pop(pair_id, None)
        if other is None or other.mirror == record.mirror:
            self._pending[pair_id] = record
            while len(self._pending) > self.max_pending:
                self._pending.popitem(last=False)
            return
        request, mirror = (other, record) if record.mirror else (record, other)
        ok = not request.error_type and not mirror.error_type
        self._matched.append(
            _Matched(
                time=now,
                upstream=request.upstream,
                mirror=mirror.upstream,
                ttft=_minus(mirror.timing.ttft, request.timing.ttft) if ok else None,
                tpot=_minus(mirror.timing.tpot, request.timing.tpot) if ok else None,
                request_ok=not request.error_type,
                mirror_ok=not mirror.error_type,
            )
        )

    def state(self, now: float) -> list[MatchedState]:
        """The pairs matched in the last `window_s` seconds as plain values, for `merge`."""
        horizon = now - self.window_s
        return [astuple(m) for m in self._matched if m.time > horizon]

    def merge(self, states: Iterable[MatchedState]) -> None:
        """Another process's matched pairs (`state`), among these in the order they were matched."""
        merged = sorted([*self._matched, *(_Matched(*m) for m in states)], key=lambda m: m.time)
        self._matched.clear()
        self._matched.extend(merged)  # the oldest fall off past max_pairs

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """Per (request's route, mirror's route): pairs, errors on each side, and the median
        differences (mirror − request) of the pairs where both answered."""
        horizon = now - self.window_s
        matched = self._matched
        while matched and matched[0].time <= horizon:
            matched.popleft()
        groups: dict[tuple[str, str], list[_Matched]] = {}
        for m in matched:
            groups.setdefault((m.upstream, m.mirror), []).append(m)
        out = []
        for (upstream, mirror), found in sorted(groups.items()):
            ttft = [m.ttft for m in found if m.ttft is not None]
            tpot = [m.tpot for m in found if m.tpot is not None]
            out.append(
                {
                    "upstream": upstream,
                    "mirror": mirror,
                    "pairs": len(found),
                    "both_ok": sum(m.request_ok and m.mirror_ok for m in found),
                    "request_errors": sum(not m.request_ok for m in found),
                    "mirror_errors": sum(not m.mirror_ok for m in found),
                    "ttft_difference_p50": _median(ttft),
                    "tpot_difference_p50": _median(tpot),
                    "mirror_first": sum(d < 0 for d in ttft),  # pairs whose mirror had the first token earlier
                    "compared": len(ttft),
                }
            )
        return out
