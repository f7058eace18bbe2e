"""The proxy's own warnings about what fails around it, rate-limited.

`LogLimiter` (pure) decides which lines go out; `RateLimitedLog` logs its decisions and
`flushing()` runs its per-interval summaries; `UpstreamFailures` words the upstream's failures;
`origin()` names an endpoint without userinfo, path or query.
"""

from __future__ import annotations

from proxy.logs.limiter import LogLimiter, Repeats
from proxy.logs.origin import origin, without_credentials
from proxy.logs.ratelimited import RateLimitedLog, flushing
from proxy.logs.stack import stack_of
from proxy.logs.upstream_failures import UpstreamFailures

__all__ = [
    "LogLimiter",
    "RateLimitedLog",
    "Repeats",
    "UpstreamFailures",
    "flushing",
    "origin",
    "stack_of",
    "without_credentials",
]
