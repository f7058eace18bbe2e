"""The record of one finished request: what happened to it, in frozen values, handed to every
observer (metrics, spans, the live view, the access log) in the process that served it.

Built once per request, when it ends (`bookkeeping.py`), from what its handler saw, its decided
`Outcome`, and what the tracer answered when asked once (`Traced`: trace id, outcome sampling,
the root span's start for the span observer). Observers only read it; `usage_of` is the one rule
for which usage a record carries.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from opentelemetry.trace import Link, SpanContext

from proxy.dialects import StreamReader, Usage
from proxy.errors import ErrorType
from proxy.exchange.timing import RequestTiming
from proxy.upstream.tcpinfo import TcpStats

if TYPE_CHECKING:
    from proxy.accounting.prices import Cost
    from proxy.accounting.ratelimits import RateLimits

__all__ = [
    "UNKNOWN_MODEL", "RequestRecord", "SpanStart", "Traced", "UsageSource", "model_label", "usage_of",
]  # fmt: skip

UsageSource = Literal["reported", "counted", "none"]
# What a request that names no model (an `other` path, a body without one) is called wherever a
# model is shown: the metrics' `model` label, the live view's page and its JSON API.
UNKNOWN_MODEL = "unknown"


def model_label(model: str | None) -> str:
    """The model as the metrics and the live view name it: `unknown` when the request named none."""
    return model or UNKNOWN_MODEL


class SpanStart(Protocol):
    """The request's root span as it was started (the tracer's own, `proxy.telemetry.spans.RootSpan`):
    the span observer ends it with this context, parent, links and start time, these attributes,
    and the output text when content is captured."""

    @property
    def name(self) -> str: ...

    @property
    def context(self) -> SpanContext: ...

    @property
    def parent(self) -> SpanContext | None: ...  # the client's, when it sent a traceparent

    @property
    def start_time(self) -> int: ...  # epoch ns

    @property
    def links(
        self,
    ) -> tuple[Link, ...]: ...  # `--parent link`: the caller's span; a --mirror copy's: the request it copies

    @property
    def attributes(self) -> dict[str, Any]: ...  # as set at start (request attributes, parameters, input if captured)

    @property
    def output(self) -> str | None: ...  # the output text, only with --capture-content

    @property
    def output_value(self) -> str | None: ...  # the answer's plain text (output.value), only with --capture-io-values


@dataclass(frozen=True, slots=True)
class Traced:
    """What telemetry says of a finished request, asked once: its trace id (None when it is not
    traced or outcome sampling dropped it), the sampling decision ("" none, why it is kept, or
    "dropped"), and the root span's start for the span observer (None when nothing is to be
    exported: not sampled, dropped, or no exporter in reach)."""

    trace_id: str | None = None
    sampling: str = ""
    span: SpanStart | None = None


def usage_of(reader: StreamReader | None, streaming: bool, token_events: int) -> tuple[Usage, UsageSource]:
    """The usage a record carries and where it came from: the upstream's report when it made one,
    else, for a parsed stream, the token events counted (output only)."""
    usage = reader.usage if reader is not None and reader.usage is not None else Usage()
    if usage.output_tokens is not None:
        return usage, "reported"
    if streaming and reader is not None:
        return dataclasses.replace(usage, output_tokens=token_events), "counted"
    if not streaming and reader is not None and reader.usage is not None:
        return usage, "reported"  # a whole body's usage, e.g. embeddings (input tokens only)
    return usage, "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """Everything known about one finished request; handed to metrics, spans and observers."""

    trace_id: str | None  # 32 hex, when the request was traced
    api: str
    operation: str | None
    model: str | None
    response_model: str | None
    stream: bool
    method: str
    path: str
    status_code: int
    error_type: ErrorType | Literal[""]  # "" on success (proxy/exchange/outcome.py decides it)
    timing: RequestTiming
    usage: Usage
    usage_source: str  # "reported" | "counted" | "none"
    finish_reasons: tuple[str, ...]
    response_id: str | None
    provider: str | None = None  # gen_ai.provider.name
    sampling: str = ""  # outcome sampling: "" (no decision), why the trace is kept, or "dropped"
    # who sent it (attribution attributes, incl. taotrace.key.id), its rate-limit headers, its cost
    attributes: tuple[tuple[str, str], ...] = field(default=(), kw_only=True)
    rate_limits: RateLimits | None = field(default=None, kw_only=True)
    cost: Cost | None = field(default=None, kw_only=True)
    tcp: TcpStats | None = field(default=None, kw_only=True)  # the upstream connection's TCP_INFO (Linux)
    span: SpanStart | None = field(default=None, kw_only=True)  # the root span's start, for the span observer
    upstream: str = field(default="", kw_only=True)  # the route's name ("" when no route matched)
    # --mirror: the id both records of a pair share, and whether this is the mirror's copy
    pair_id: str | None = field(default=None, kw_only=True)
    mirror: bool = field(default=False, kw_only=True)
    # The request's messages as JSON, only with --capture-content (None above RING_CONTENT_LIMIT):
    # the live view shows it, and `taotrace compare --from-live` replays it.
    input_content: str | None = field(default=None, kw_only=True)

    @property
    def server_wait(self) -> float | None:
        """An estimate: prefill_wait minus one round trip (floored at 0), the provider's queue and
        prefill as seen from outside. None without both."""
        prefill = self.timing.prefill_wait
        rtt = self.tcp.round_trip if self.tcp is not None else None
        if prefill is None or rtt is None:
            return None
        return max(0.0, prefill - rtt)
