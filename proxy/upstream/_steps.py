"""Where the pool stamps one request's connection steps: the exchange's phase clock
(`proxy.exchange.timing.PhaseClock`) is one, seen here only through this protocol."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Steps"]


class Steps(Protocol):
    """A request's connection steps as the pool times them (seconds, on the pool's clock)."""

    reused: bool | None  # a pooled connection carried it
    pool_wait: float | None  # waiting for a free connection under the cap
    dns: float | None
    connect: float | None  # TCP connect plus TLS handshake

    def mark(self, t: float) -> None:
        """A step started at `t`."""

    def since_mark(self, t: float) -> float:
        """Seconds from the last mark to `t`."""
        ...

    def sent(self, t: float) -> None:
        """The request (headers, then each body chunk) was written upstream at `t`."""
