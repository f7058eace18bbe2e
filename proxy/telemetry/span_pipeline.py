"""The small ends of the span pipeline: a processor that exports each span as it ends, one that
hands each span to several (one batch processor per exporter), the memory exporter (for tests),
and the adapter that feeds our spans to an OpenTelemetry SDK exporter (`console`, `zipkin`, any
`opentelemetry_traces_exporter` plug-in).

The batch processor the proxy runs is `batch_processor.BatchSpanProcessor`; the OTLP exporter is
`span_exporter.OtlpSpanExporter`. All of them implement `spandata.SpanProcessor` / `SpanExporter`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource as SdkResource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter as LibraryExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.types import Attributes

from proxy.telemetry.spandata import Resource, Scope, SpanData, SpanExporter, SpanProcessor

__all__ = ["FanOutSpanProcessor", "InMemorySpanExporter", "LibrarySpanExporter", "SimpleSpanProcessor"]

_logger = logging.getLogger(__name__)


class SimpleSpanProcessor:
    """Exports each span when it ends, on the caller's thread (tests, and embedding code that wants
    no thread): never raises. The proxy itself always batches (`batch_processor.py`)."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self._stopped = False

    def on_end(self, span: SpanData) -> None:
        if self._stopped:
            return
        try:
            self.exporter.export((span,))
        except Exception as error:  # noqa: BLE001 - an exporter's failure never reaches the request
            _logger.warning("span export failed: %s", type(error).__name__)

    def force_flush(self, timeout: float) -> bool:
        return True  # nothing is held

    def shutdown(self, timeout: float) -> bool:
        if not self._stopped:
            self._stopped = True
            self.exporter.shutdown()
        return True


class InMemorySpanExporter:
    """Keeps every span exported, for tests to read (the names of the SDK's exporter of that name)."""

    def __init__(self) -> None:
        self._spans: list[SpanData] = []
        self._lock = threading.Lock()  # export runs on a processor's thread, tests read on theirs
        self._stopped = False

    def export(self, spans: Sequence[SpanData]) -> bool:
        if self._stopped:
            return False
        with self._lock:
            self._spans.extend(spans)
        return True

    def get_finished_spans(self) -> tuple[SpanData, ...]:
        with self._lock:
            return tuple(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def shutdown(self) -> None:
        self._stopped = True


class FanOutSpanProcessor:
    """Hands each span to every processor, in order (the SDK's `SynchronousMultiSpanProcessor`):
    one batch processor per exporter, so a slow exporter never holds another's spans back."""

    def __init__(self, processors: Sequence[SpanProcessor]) -> None:
        self.processors = tuple(processors)

    def on_end(self, span: SpanData) -> None:
        for processor in self.processors:
            processor.on_end(span)

    def _each(self, timeout: float, stop: bool) -> bool:
        """Flush or shut down each, in turn, within one `timeout` for all."""
        deadline = time.monotonic() + timeout
        done = True
        for processor in self.processors:
            left = max(deadline - time.monotonic(), 0.0)
            done = (processor.shutdown(left) if stop else processor.force_flush(left)) and done
        return done

    def force_flush(self, timeout: float) -> bool:
        return self._each(timeout, stop=False)

    def shutdown(self, timeout: float) -> bool:
        return self._each(timeout, stop=True)


class LibrarySpanExporter:
    """An OpenTelemetry SDK span exporter fed our spans, each turned into the SDK's `ReadableSpan`
    (its public constructor) on the batch processor's thread. The way to every exporter but OTLP
    (which is ours, and encodes faster): slower per span, never on the event loop."""

    def __init__(self, exporter: LibraryExporter) -> None:
        self.exporter = exporter
        # Made once per resource and scope (a process has one of each): the SDK's Resource
        # validates its attributes when made. Keyed by
        # identity, the object kept beside its conversion so the id is never reused meanwhile.
        self._resources: dict[int, tuple[Resource, SdkResource]] = {}
        self._scopes: dict[int, tuple[Scope, InstrumentationScope]] = {}

    def _resource(self, resource: Resource) -> SdkResource:
        hit = self._resources.get(id(resource))
        if hit is None:
            if len(self._resources) >= 64:  # a bound, never reached by the resources taotrace makes
                self._resources.clear()
            hit = self._resources[id(resource)] = (
                resource,
                SdkResource(dict(resource.attributes), resource.schema_url),
            )
        return hit[1]

    def _scope(self, scope: Scope) -> InstrumentationScope:
        hit = self._scopes.get(id(scope))
        if hit is None:
            if len(self._scopes) >= 64:
                self._scopes.clear()
            converted = InstrumentationScope(scope.name, scope.version, scope.schema_url, scope.attributes)
            hit = self._scopes[id(scope)] = (scope, converted)
        return hit[1]

    def readable(self, span: SpanData) -> ReadableSpan:
        """`span` as the SDK's exporters take it (its dropped attribute count included)."""
        attributes: Attributes = span.attributes
        if span.dropped_attributes:
            bounded = BoundedAttributes(attributes=span.attributes)
            bounded.dropped = span.dropped_attributes
            attributes = bounded
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=self._resource(span.resource),
            attributes=attributes,
            events=(),
            links=span.links,
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=self._scope(span.instrumentation_scope),
        )

    def export(self, spans: Sequence[SpanData]) -> bool:
        try:
            return self.exporter.export([self.readable(s) for s in spans]) is SpanExportResult.SUCCESS
        except Exception as error:  # noqa: BLE001 - a plug-in's failure never reaches the processor's thread
            _logger.warning("span export through %s failed: %s", type(self.exporter).__name__, type(error).__name__)
            return False

    def shutdown(self) -> None:
        try:
            self.exporter.shutdown()
        except Exception as error:  # noqa: BLE001 - as export
            _logger.warning("shutting %s down failed: %s", type(self.exporter).__name__, type(error).__name__)
