"""What the exchange asks of tracing, as a protocol: the telemetry that implements it
(`proxy.telemetry.spans.Spans`) sits above the exchange and reads its records.

A request's root span is started before its bytes go upstream (the upstream's `traceparent`
names it), and concluded once when the request ends: its trace id and the outcome sampling
decision go on the record. Building and exporting spans is an observer's job, from the record.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Protocol, TypeVar

from opentelemetry.trace import SpanContext

from proxy.config.routes import Route
from proxy.dialects import RequestInfo
from proxy.exchange.record import Traced
from proxy.exchange.timing import RequestTiming

__all__ = ["Span", "Tracer"]


class Span(Protocol):
    """A started root span, as far as the exchange goes: its context links a mirror copy to it."""

    def get_span_context(self) -> SpanContext: ...


S = TypeVar("S", bound=Span)


class Tracer(Protocol[S]):
    """Starts a request's root span, puts its context in the upstream's headers, and concludes it."""

    @property
    def untraced(self) -> S:
        """The span of a request whose span could not be started: traced nowhere."""
        ...

    def start(
        self,
        info: RequestInfo,
        method: str,
        path: str,
        query: str,
        carrier: Mapping[str, str],
        t0: float,
        route: Route | None = None,
        links: Sequence[SpanContext] = (),
    ) -> S: ...

    def inject(self, span: S, headers: MutableMapping[str, str]) -> None: ...

    def trace_id(self, span: S) -> str | None: ...

    def conclude(
        self, span: S, error_type: str, timing: RequestTiming, output_text: str | None, output_value: str | None
    ) -> Traced: ...
