"""Outcome-aware trace sampling, decided when a request has ended (its spans all end in this process).

Pure: a request's outcome in, a reason to keep its trace (or None: drop it) out. With a ratio
below 1, a trace is kept when, in this order:

    parent          the client's `traceparent` said sampled: its trace must not have a hole
    error           the request ended with an error type (`keep_errors`)
    slow_ttft       its first token came later than the TTFT threshold
    slow_duration   it lasted longer than the duration threshold
    ratio           its trace id falls in the ratio, exactly as the `traceidratio` sampler decides
                    (lower 64 bits below ratio * 2^64), so a collector or another replica with
                    the same ratio keeps the same traces

A client that sent `sampled=0` never gets here: the default parent-based sampler does not
record the request's spans at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.telemetry.sampler import TRACE_ID_LIMIT, ratio_bound

__all__ = ["OutcomeSampling"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomeSampling:
    """Which finished requests keep their trace. `ratio` 1 keeps all and decides nothing."""

    ratio: float = 1.0
    keep_errors: bool = True
    ttft_over: float | None = None
    duration_over: float | None = None
    _bound: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError("ratio must be between 0 and 1")
        object.__setattr__(self, "_bound", ratio_bound(self.ratio))

    @property
    def active(self) -> bool:
        return self.ratio < 1.0

    def reason(
        self, trace_id: int, parent_sampled: bool, error_type: str, ttft: float | None, duration: float
    ) -> str | None:
        """Why the trace is kept, or None to drop it."""
        if parent_sampled:
            return "parent"
        if self.keep_errors and error_type:
            return "error"
        if self.ttft_over is not None and ttft is not None and ttft > self.ttft_over:
            return "slow_ttft"
        if self.duration_over is not None and duration > self.duration_over:
            return "slow_duration"
        if trace_id & TRACE_ID_LIMIT < self._bound:
            return "ratio"
        return None
