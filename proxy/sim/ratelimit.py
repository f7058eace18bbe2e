"""Per-key rate-limit budgets, and the headers each provider sends about them.

A fixed window per API key: at most `requests` requests and `tokens` tokens (prompt plus the
planned output, as providers estimate at admission) per `window` seconds; 0 means no limit of
that kind. Every answer carries the provider's headers (OpenAI `x-ratelimit-*` with resets
like `6m0s`; Anthropic `anthropic-ratelimit-*` with RFC 3339 resets); a request over budget is
answered 429 with `retry-after`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

__all__ = ["Budgets", "Quota", "go_duration", "quota_headers"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Quota:
    """One key's budget after a request: limits (0 = none), what is left, seconds to the reset."""

    requests: int
    remaining_requests: int
    tokens: int
    remaining_tokens: int
    reset: float
    allowed: bool


@dataclass
class _Window:
    start: float
    requests: int = 0
    tokens: int = 0


class Budgets:
    """Fixed-window request and token budgets per key (None: the anonymous caller)."""

    def __init__(self, requests: int, tokens: int, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.requests = requests
        self.tokens = tokens
        self.window = window
        self.clock = clock
        self._windows: dict[str | None, _Window] = {}

    @property
    def enabled(self) -> bool:
        return self.requests > 0 or self.tokens > 0

    def charge(self, key: str | None, tokens: int) -> Quota:
        """Spend one request and `tokens` from `key`'s window, unless that would exceed a limit."""
        now = self.clock()
        window = self._windows.get(key)
        if window is None or now - window.start >= self.window:
            window = self._windows[key] = _Window(now)
        over = (self.requests > 0 and window.requests + 1 > self.requests) or (
            self.tokens > 0 and window.tokens + tokens > self.tokens
        )
        if not over:
            window.requests += 1
            window.tokens += tokens
        return Quota(
            requests=self.requests,
            remaining_requests=max(0, self.requests - window.requests),
            tokens=self.tokens,
            remaining_tokens=max(0, self.tokens - window.tokens),
            reset=max(0.0, window.start + self.window - now),
            allowed=not over,
        )


def go_duration(seconds: float) -> str:
    """OpenAI's reset format (Go's time.Duration): `20ms`, `1s`, `6m0s`, `1h0m0s`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes:
        return f"{int(minutes)}m{text}"
    return text


def quota_headers(api: str, quota: Quota, now: float) -> dict[str, str]:
    """The provider's rate-limit headers (`now`: epoch seconds), plus `retry-after` when refused."""
    out: dict[str, str] = {}
    kinds = [(k, limit, left) for k, limit, left in (
        ("requests", quota.requests, quota.remaining_requests),
        ("tokens", quota.tokens, quota.remaining_tokens),
    ) if limit > 0]  # fmt: skip
    if api == "messages":
        reset = datetime.fromtimestamp(math.ceil(now + quota.reset), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for kind, limit, left in kinds:
            out[f"anthropic-ratelimit-{kind}-limit"] = str(limit)
            out[f"anthropic-ratelimit-{kind}-remaining"] = str(left)
            out[f"anthropic-ratelimit-{kind}-reset"] = reset
    else:
        for kind, limit, left in kinds:
            out[f"x-ratelimit-limit-{kind}"] = str(limit)
            out[f"x-ratelimit-remaining-{kind}"] = str(left)
            out[f"x-ratelimit-reset-{kind}"] = go_duration(quota.reset)
    if not quota.allowed:
        out["retry-after"] = str(max(1, math.ceil(quota.reset)))
    return out
