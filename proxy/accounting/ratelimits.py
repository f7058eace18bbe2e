"""The upstream's rate-limit headers, read into one frozen record. Pure: the caller passes `now`.

    OpenAI     x-ratelimit-{limit,remaining,reset}-{requests,tokens}      reset: `6m0s`, `1s`, `20ms`
    Anthropic  anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}
                                                                          reset: RFC 3339 time
    both       retry-after (seconds or an HTTP date), retry-after-ms

Resets are reported as seconds from the response (0 when the time has passed); a value that
does not parse is left out, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

__all__ = ["KINDS", "RateLimit", "RateLimits", "parse_reset", "read_rate_limits"]

KINDS = ("requests", "tokens", "input_tokens", "output_tokens")
_OPENAI = "x-ratelimit-"
_ANTHROPIC = "anthropic-ratelimit-"
_FIELDS = ("limit", "remaining", "reset")
_FIRST = frozenset("xXaArR")  # the first letter of every header read here
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)")
_GO_FULL = re.compile(r"(?:\d+(?:\.\d+)?(?:h|ms|us|µs|ns|m|s))+")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
MAX_SECONDS = 366 * 86400.0  # beyond a year: not a rate-limit window


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """One kind of limit (requests, tokens, …) as the upstream reported it; None where it did not."""

    kind: str
    limit: int | None = None
    remaining: int | None = None
    reset: float | None = None  # seconds from the response until the limit is replenished


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimits:
    """Every rate-limit header of one response."""

    limits: tuple[RateLimit, ...] = ()
    retry_after: float | None = None  # seconds
    observed_at: float = 0.0  # epoch seconds when the headers arrived (resets count from here)

    def attributes(self) -> dict[str, float | int]:
        """Span attributes: `taotrace.ratelimit.{kind}.{limit,remaining,reset}`, `…retry_after`."""
        out: dict[str, float | int] = {}
        for rl in self.limits:
            for name in _FIELDS:
                value = getattr(rl, name)
                if value is not None:
                    out[f"taotrace.ratelimit.{rl.kind}.{name}"] = value
        if self.retry_after is not None:
            out["taotrace.ratelimit.retry_after"] = self.retry_after
        return out


def _count(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() and len(value) < 19 else None


def _seconds(value: float) -> float | None:
    return value if 0 <= value <= MAX_SECONDS else None


def parse_reset(value: str, now: float) -> float | None:
    """Seconds until `value`: a Go-style duration (`6m0s`, `1s`, `20ms`, `1h2m3.5s`), plain seconds
    (`30`, `0.5`), an RFC 3339 time or an HTTP date (`now` is the epoch time of the response)."""
    value = value.strip()
    if not value or len(value) > 64:
        return None
    last = value[-1]
    if last.isdigit():  # plain seconds, or a date ending in a digit
        try:
            return _seconds(float(value))
        except ValueError:
            pass
    elif last in "smh" and value[0].isdigit() and _GO_FULL.fullmatch(value):  # the common case: OpenAI's
        return _seconds(sum(float(n) * _UNIT[u] for n, u in _GO_DURATION.findall(value)))
    when: datetime | None = None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return _seconds(max(0.0, when.timestamp() - now))


def read_rate_limits(headers: Iterable[tuple[str, str]], now: float) -> RateLimits | None:
    """The rate-limit headers among `headers`, or None when there are none. `now`: the epoch time
    the headers arrived."""
    found: dict[str, dict[str, str]] = {}
    retry_after: float | None = None
    retry_after_ms: float | None = None
    for key, value in headers:
        if key[:1] not in _FIRST:  # most headers: skipped without lowering their name
            continue
        name = key.lower()
        if name.startswith(_OPENAI):
            field, _, kind = name[len(_OPENAI) :].partition("-")
        elif name.startswith(_ANTHROPIC):
            kind, _, field = name[len(_ANTHROPIC) :].rpartition("-")
        elif name == "retry-after":
            retry_after = parse_reset(value, now)
            continue
        elif name == "retry-after-ms":
            ms = _count(value)
            retry_after_ms = ms / 1000 if ms is not None else None
            continue
        else:
            continue
        kind = kind.replace("-", "_")
        if kind in KINDS and field in _FIELDS:
            found.setdefault(kind, {})[field] = value
    if not found and retry_after is None and retry_after_ms is None:
        return None
    limits = tuple(
        RateLimit(
            kind=kind,
            limit=_count(fields["limit"]) if "limit" in fields else None,
            remaining=_count(fields["remaining"]) if "remaining" in fields else None,
            reset=parse_reset(fields["reset"], now) if "reset" in fields else None,
        )
        for kind in KINDS
        if (fields := found.get(kind)) is not None
    )
    return RateLimits(
        limits=limits, retry_after=retry_after_ms if retry_after_ms is not None else retry_after, observed_at=now
    )
