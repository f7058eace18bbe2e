"""Our OTLP span exporter: spans encoded by `otlp.py`, delivered (sent, retried per the spec) by `otlp_delivery.py`.

It implements `spandata.SpanExporter`: the batch processor (`batch_processor.py`) batches, bounds
the queue and calls `export` from its thread, which returns whether the batch was delivered. A
batch that cannot be sent is dropped and counted (`dropped`, and by the processor's `on_drop`);
the delivery logs the failure as one WARNING record that `collector_log.CollectorLog` turns into
our rate-limited line.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence

from proxy.telemetry import otlp
from proxy.telemetry.otlp_delivery import Delivery, backoff
from proxy.telemetry.otlp_env import ExportSettings
from proxy.telemetry.otlp_transport import Transport
from proxy.telemetry.spandata import SpanData

__all__ = ["OtlpSpanExporter", "backoff"]

_logger = logging.getLogger(__name__)  # collector_log.LOGGERS lists it


class OtlpSpanExporter:
    """OTLP/HTTP protobuf or OTLP/gRPC, as `settings.protocol` says."""

    def __init__(
        self,
        settings: ExportSettings,
        transport: Transport | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2),
        pause: Callable[[], None] | None = otlp.release_gil,
    ) -> None:
        """`pause`: called every `otlp.PAUSE_EVERY` spans encoded (by default the GIL is given to
        the event loop); None where no loop relays streams."""
        self.settings = settings
        self._pause = pause
        self._delivery = Delivery(settings, "traces", transport, monotonic=monotonic, jitter=jitter)
        self.dropped = 0  # spans in batches given up (read by tests and the CHANGELOG's promise)

    def export(self, spans: Sequence[SpanData]) -> bool:
        """Send one batch (retrying as the spec says); True when the collector took it."""
        if self._delivery.stopped:
            return False
        try:
            body = otlp.encode_spans(spans, self._pause)
        except Exception as error:  # noqa: BLE001 - not a span (a bug upstream of here): failed, never raised
            _logger.error("Failed to encode span batch: %s", type(error).__name__)
            self.dropped += len(spans)
            return False
        if self._delivery.send(body):
            return True
        self.dropped += len(spans)
        return False

    def shutdown(self) -> None:
        self._delivery.shutdown()
