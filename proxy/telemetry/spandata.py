"""A finished span as taotrace exports it, and the two roles that move spans out of the process.

The pipeline is our own, built on the OTLP wire format rather than on the OpenTelemetry SDK's
span classes: `spans.Spans` makes `SpanData`, a `SpanProcessor` receives each one as it ends
(the batch processor queues them for a thread), and a `SpanExporter` sends a batch (ours over
OTLP, any SDK exporter through `span_pipeline.LibrarySpanExporter`, or memory for tests). Field
names are those of the SDK's `ReadableSpan`, so code and tests that read either read both. Context, link, status and kind are the OpenTelemetry API's
public types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.util.types import AnyValue

__all__ = ["UNSET", "Resource", "Scope", "SpanData", "SpanExporter", "SpanProcessor"]

UNSET = Status(StatusCode.UNSET)


@dataclass(frozen=True, eq=True)
class Resource:
    """The process that produced the spans (`service.name`, ...), and the schema its names follow."""

    attributes: Mapping[str, AnyValue]
    schema_url: str = ""

    def __hash__(self) -> int:
        return hash((tuple(self.attributes.items()), self.schema_url))


@dataclass(frozen=True)
class Scope:
    """The instrumentation scope: taotrace, its version, and the conventions' schema URL."""

    name: str
    version: str | None = None
    schema_url: str | None = None
    attributes: Mapping[str, AnyValue] | None = None


@dataclass(slots=True, eq=False)
class SpanData:
    """One finished span. `attributes` holds valid OTLP values only (lists as tuples)."""

    name: str
    context: SpanContext
    parent: SpanContext | None
    kind: SpanKind
    start_time: int  # Unix epoch nanoseconds
    end_time: int
    attributes: dict[str, AnyValue]
    resource: Resource
    instrumentation_scope: Scope
    status: Status = UNSET
    links: tuple[Link, ...] = ()
    events: tuple[()] = field(default=())  # taotrace records none; the field keeps ReadableSpan's shape
    dropped_attributes: int = 0


class SpanProcessor(Protocol):
    """Receives each span as it ends, on the event loop: must return at once and never raise."""

    def on_end(self, span: SpanData) -> None: ...

    def force_flush(self, timeout: float) -> bool: ...

    def shutdown(self, timeout: float) -> bool: ...


class SpanExporter(Protocol):
    """Sends one batch, from the processor's thread; True when it was delivered."""

    def export(self, spans: Sequence[SpanData]) -> bool: ...

    def shutdown(self) -> None: ...
