"""Our OTLP span exporter: spans encoded by `otlp.py`, delivered (sent, retried per the spec) by `otlp_delivery.py`.

It plugs into the SDK's public `SpanExporter` interface (the batch processor batches, bounds the
queue and calls `export` from its thread). A batch that cannot be sent is dropped and counted
(`dropped`); the delivery logs the failure as one WARNING record that `collector_log.CollectorLog`
turns into our rate-limited line.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from proxy.telemetry import otlp
from proxy.telemetry.otlp_delivery import Delivery, backoff
from proxy.telemetry.otlp_env import ExportSettings
from proxy.telemetry.otlp_transport import Transport

__all__ = ["OtlpSpanExporter", "backoff"]

_logger = logging.getLogger(__name__)  # collector_log.LOGGERS lists it


class OtlpSpanExporter(SpanExporter):
    """OTLP/HTTP protobuf or OTLP/gRPC, as `settings.protocol` says."""

    def __init__(
        self,
        settings: ExportSettings,
        transport: Transport | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2),
    ) -> None:
        self.settings = settings
        self._delivery = Delivery(settings, "traces", transport, monotonic=monotonic, jitter=jitter)
        self.dropped = 0  # spans in batches given up (read by tests and the CHANGELOG's promise)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._delivery.stopped:
            return SpanExportResult.FAILURE
        try:
            # The SDK's spans have the fields otlp.py reads, until spans.py makes SpanData.
            body = otlp.encode_spans(cast(Any, spans), otlp.release_gil)
        except Exception as error:  # noqa: BLE001 - a batch neither encoder copes with: failed, never raised
            _logger.error("Failed to encode span batch: %s", type(error).__name__)
            self.dropped += len(spans)
            return SpanExportResult.FAILURE
        if self._delivery.send(body):
            return SpanExportResult.SUCCESS
        self.dropped += len(spans)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._delivery.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is held here: the batch processor holds the queue
