"""The small ends of the span pipeline: a processor that exports each span as it ends, and the
exporters that need no network (memory, for tests; the console, for `OTEL_TRACES_EXPORTER=console`).

The batch processor the proxy runs is `batch_processor.BatchSpanProcessor`; the OTLP exporter is
`span_exporter.OtlpSpanExporter`. All of them implement `spandata.SpanProcessor` / `SpanExporter`.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, TextIO

from proxy.telemetry.spandata import SpanData, SpanExporter

__all__ = ["ConsoleSpanExporter", "InMemorySpanExporter", "SimpleSpanProcessor", "span_json"]

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


def _time(ns: int) -> str:
    """RFC 3339 in UTC with all nine digits of the nanoseconds."""
    whole = datetime.fromtimestamp(ns // 1_000_000_000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{ns % 1_000_000_000:09d}Z"


def _jsonable(value: object) -> Any:
    """Attribute values as JSON: sequences as arrays, bytes as hex, anything else as its str."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def span_json(span: SpanData) -> dict[str, Any]:
    """One span as a JSON object: ids in hex, times as RFC 3339 and Unix nanoseconds."""
    ctx, parent = span.context, span.parent
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "parent_is_remote": bool(parent.is_remote) if parent is not None else None,
        "trace_state": ctx.trace_state.to_header() if ctx.trace_state else "",
        "kind": span.kind.name,
        "start_time": _time(span.start_time),
        "end_time": _time(span.end_time),
        "start_time_unix_nano": span.start_time,
        "end_time_unix_nano": span.end_time,
        "attributes": dict(span.attributes),
        "dropped_attributes_count": span.dropped_attributes,
        "status": {"code": span.status.status_code.name, "description": span.status.description},
        "links": [
            {
                "trace_id": f"{link.context.trace_id:032x}",
                "span_id": f"{link.context.span_id:016x}",
                "trace_state": link.context.trace_state.to_header() if link.context.trace_state else "",
                "is_remote": bool(link.context.is_remote),
                "attributes": dict(link.attributes or {}),
            }
            for link in span.links
        ],
        "resource": {"attributes": dict(span.resource.attributes), "schema_url": span.resource.schema_url},
        "scope": {"name": span.instrumentation_scope.name, "version": span.instrumentation_scope.version},
    }


def _finite(value: Any) -> Any:
    """NaN and infinities as strings: JSON has no numbers for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _line(span: SpanData) -> str:
    obj = span_json(span)
    try:
        text = json.dumps(obj, ensure_ascii=False, allow_nan=False, default=_jsonable)
    except ValueError:
        text = json.dumps(_finite(obj), ensure_ascii=False, default=_jsonable)
    return text + "\n"


class ConsoleSpanExporter:
    """One JSON object per span per line, on `out` (`OTEL_TRACES_EXPORTER=console`)."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out if out is not None else sys.stdout

    def export(self, spans: Sequence[SpanData]) -> bool:
        try:
            self._out.write("".join([_line(s) for s in spans]))
            self._out.flush()
        except Exception as error:  # noqa: BLE001 - a closed stream or an odd value: failed, never raised
            _logger.warning("console span export failed: %s", type(error).__name__)
            return False
        return True

    def shutdown(self) -> None:
        pass  # the stream is the caller's
