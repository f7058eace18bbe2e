"""Our OTLP span exporter: spans encoded by `otlp.py`, sent by `otlp_transport.py`, retried per the spec.

It plugs into the SDK's public `SpanExporter` interface (the batch processor batches, bounds the
queue and calls `export` from its thread). One export is retried while the spec calls the failure
retryable (HTTP 429/502/503/504, a lost connection, gRPC UNAVAILABLE and kin), waiting what the
collector's `Retry-After` asks on 429/503, else an exponential back-off with jitter, and never
past the export's timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`). A batch that cannot be sent is dropped
and counted (`dropped`); the failure is logged as one WARNING record that
`collector_log.CollectorLog` turns into our rate-limited line.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from proxy.telemetry import otlp
from proxy.telemetry.otlp_env import ExportSettings, shown_endpoint
from proxy.telemetry.otlp_transport import Sent, Transport, transport_for

__all__ = ["OtlpSpanExporter", "backoff"]

_logger = logging.getLogger(__name__)  # collector_log.LOGGERS lists it


def backoff(attempt: int, jitter: float) -> float:
    """Seconds before retry `attempt` (0, 1, ...): 1, 2, 4 ... capped at 32, times `jitter` in [0.8, 1.2)."""
    return float(min(1 << min(attempt, 5), 32)) * jitter


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
        self._transport = transport if transport is not None else transport_for(settings, "traces", time.time)
        self._monotonic = monotonic
        self._jitter = jitter
        self._stopped = threading.Event()  # set by shutdown: ends a back-off wait at once
        self._where = shown_endpoint(settings.endpoint)
        self.dropped = 0  # spans in batches given up (read by tests and the CHANGELOG's promise)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._stopped.is_set():
            return SpanExportResult.FAILURE
        try:
            body = otlp.encode_spans(spans, otlp.release_gil)
        except Exception as error:  # noqa: BLE001 - a batch neither encoder copes with: failed, never raised
            _logger.error("Failed to encode span batch: %s", type(error).__name__)
            self.dropped += len(spans)
            return SpanExportResult.FAILURE
        if self._send(body):
            return SpanExportResult.SUCCESS
        self.dropped += len(spans)
        return SpanExportResult.FAILURE

    def _send(self, body: bytes) -> bool:
        deadline = self._monotonic() + self.settings.timeout
        attempt = 0
        while True:
            remaining = deadline - self._monotonic()
            sent = self._transport.send(body, max(remaining, 0.001))
            if sent.ok:
                return True
            delay = sent.retry_after if sent.retry_after is not None else backoff(attempt, self._jitter())
            if not sent.retryable or self._stopped.is_set() or self._monotonic() + delay >= deadline:
                self._failed(sent)
                return False
            _logger.debug("Retrying the span export to %s in %.2fs", self._where, delay)
            if self._stopped.wait(delay):
                self._failed(sent)
                return False
            attempt += 1

    def _failed(self, sent: Sent) -> None:
        # The status and exception go in the arguments: CollectorLog reads the cause from them.
        _logger.warning("Failed to export spans to %s: %s %s", self._where, sent.status, sent.error)

    def shutdown(self) -> None:
        self._stopped.set()
        self._transport.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is held here: the batch processor holds the queue
