"""Paired comparison (`--mirror ROUTE`): which requests get a copy sent to a second upstream,
and what that copy carries. Pure: the handler (`proxy/exchange/handler.py`) does the I/O.

A request is mirrored when its path ends with one of `--mirror-paths` (by default only the chat,
Responses and messages APIs), a coin with `--mirror-ratio` says yes, fewer than
`--mirror-max-per-minute` copies left in the last 60 s, and fewer than `--mirror-concurrency`
copies are running. The last two refusals are counted (`taotrace_mirror_dropped_total{reason}`).
In a group (`--workers`), each worker decides alone, on its share of both caps (`worker_share`).

The copy is the same body with headers from an allow-list only: never the client's
`Authorization`, `x-api-key`, `Cookie` or any other credential; the mirror's own key (from the
variable `--mirror-key-env` names) goes in the header the client used for its own.
"""

from __future__ import annotations

import random
import secrets
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from multidict import CIMultiDict

from proxy.config.settings import DEFAULT_MIRROR_PATHS

__all__ = [
    "DEFAULT_MIRROR_PATHS",
    "MIRRORED_HEADERS",
    "MirrorPolicy",
    "describe",
    "mirror_headers",
    "new_pair_id",
    "worker_share",
]

# What a copy may carry of the client's headers: the body's type and the API's version switches.
MIRRORED_HEADERS = frozenset(
    {"content-type", "accept", "user-agent", "anthropic-version", "anthropic-beta", "openai-beta"}
)
WINDOW = 60.0  # seconds: --mirror-max-per-minute counts copies started in the last minute

Clock = Callable[[], float]


def new_pair_id() -> str:
    """16 hex characters: the id both records of a pair carry."""
    return secrets.token_hex(8)


def worker_share(cap: int, index: int, workers: int) -> int:
    """Worker `index`'s share of a group's cap: the cap divided by the workers, the remainder
    to the first ones; at least 1, so a cap below the worker count lets each worker one."""
    return max(1, cap // workers + (1 if index < cap % workers else 0))


def mirror_headers(client: Iterable[tuple[str, str]], key: str | None) -> CIMultiDict[str]:
    """The copy's headers: the allow-listed ones of the client's, and the mirror's own key in the
    header the client used for its key (`x-api-key` for Anthropic-style clients, else a bearer)."""
    out: CIMultiDict[str] = CIMultiDict()
    anthropic_style = False
    for name, value in client:
        lower = name.lower()
        if lower == "x-api-key":
            anthropic_style = True
        elif lower in MIRRORED_HEADERS:
            out.add(name, value)
    if key:
        if anthropic_style:
            out["x-api-key"] = key
        else:
            out["Authorization"] = f"Bearer {key}"
    return out


@dataclass
class MirrorPolicy:
    """Decides, request by request, whether a copy goes to the mirror (`offer`), and counts it
    while it runs (`done`)."""

    route: str  # the mirror's route name
    ratio: float
    per_minute: int
    concurrency: int = 4
    paths: tuple[str, ...] = DEFAULT_MIRROR_PATHS
    key: str | None = field(default=None, repr=False)
    clock: Clock = field(default=lambda: 0.0)
    rng: random.Random = field(default_factory=random.Random)
    running: int = 0
    _started: deque[float] = field(default_factory=deque)
    dropped: dict[str, int] = field(default_factory=lambda: {"per_minute": 0, "concurrency": 0})

    def eligible(self, path: str, routed_to: str) -> bool:
        """A path the mirror is for, on a route other than the mirror's own."""
        return routed_to != self.route and path.rstrip("/").endswith(self.paths)

    def offer(self, path: str, routed_to: str) -> str:
        """ "" to send a copy now (then `running` counts it until `done()`), else why not:
        "path", "ratio" (not sampled), "per_minute" or "concurrency" (both counted as drops)."""
        if not self.eligible(path, routed_to):
            return "path"
        if self.rng.random() >= self.ratio:
            return "ratio"
        now = self.clock()
        started = self._started
        while started and started[0] <= now - WINDOW:
            started.popleft()
        if len(started) >= self.per_minute:
            self.dropped["per_minute"] += 1
            return "per_minute"
        if self.running >= self.concurrency:
            self.dropped["concurrency"] += 1
            return "concurrency"
        started.append(now)
        self.running += 1
        return ""

    def done(self) -> None:
        self.running -= 1


def describe(policy: MirrorPolicy, url: str, key_env: str | None, workers: int = 1) -> str:
    """The start-up notice: what mirroring costs and who receives the copies; in a group of
    `workers`, the caps each worker applies on its own."""
    key = f"with the key in ${key_env}" if key_env else "with no key (--mirror-key-env unset)"
    caps = f"at most {policy.per_minute} a minute, {policy.concurrency} at once"
    if workers > 1:
        per_minute = sorted({worker_share(policy.per_minute, i, workers) for i in range(workers)}, reverse=True)
        at_once = sorted({worker_share(policy.concurrency, i, workers) for i in range(workers)}, reverse=True)
        caps = (
            f"at most {sum(worker_share(policy.per_minute, i, workers) for i in range(workers))} a minute, "
            f"{sum(worker_share(policy.concurrency, i, workers) for i in range(workers))} at once, "
            f"shared by {workers} workers: {' or '.join(map(str, per_minute))} a minute and "
            f"{' or '.join(map(str, at_once))} at once each"
        )
    return (
        f"mirroring: {policy.ratio:.0%} of requests to {', '.join(policy.paths)} ({caps}) are also sent to "
        f"upstream {policy.route} ({url}) {key}. "
        f"Token spend doubles on that share, and {policy.route} receives copies of those prompts."
    )
