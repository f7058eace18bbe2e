"""Our metrics pipeline: meters (`aggregate.py`) collected every interval and handed to an exporter.

`MetricPipeline` owns the meters of one resource and, when given an exporter, a thread that
collects and exports every `interval` seconds (`OTEL_METRIC_EXPORT_INTERVAL`), each export bounded
by `timeout` (`OTEL_METRIC_EXPORT_TIMEOUT`). `shutdown` exports the last interval but returns after
its own timeout whatever the collector does. Exporters: `OtlpMetricExporter` (encoded by
`otlp_metrics.py`, delivered and retried by `otlp_delivery.py`) and `ConsoleMetricExporter`
(one OTLP/JSON object per line on stdout).
"""

from __future__ import annotations

import json
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TextIO

from proxy.telemetry.aggregate import CARDINALITY_LIMIT, Meter, ScopeData, Temporality
from proxy.telemetry.otlp import release_gil
from proxy.telemetry.otlp_delivery import Delivery
from proxy.telemetry.otlp_env import ExportSettings
from proxy.telemetry.otlp_metrics import encode_metrics, json_metrics
from proxy.telemetry.otlp_transport import Transport

__all__ = ["ConsoleMetricExporter", "MetricExporter", "MetricPipeline", "OtlpMetricExporter"]

log = logging.getLogger("taotrace")

DEFAULT_INTERVAL = 60.0  # seconds: the spec's default OTEL_METRIC_EXPORT_INTERVAL
DEFAULT_TIMEOUT = 30.0  # seconds: the spec's default OTEL_METRIC_EXPORT_TIMEOUT


class MetricExporter(Protocol):
    def export(self, resource: Mapping[str, Any], scopes: Sequence[ScopeData], timeout: float) -> bool: ...

    def shutdown(self) -> None: ...


class OtlpMetricExporter:
    """OTLP/HTTP protobuf or OTLP/gRPC, as `settings.protocol` says; `dropped` counts exports given up."""

    def __init__(
        self,
        settings: ExportSettings,
        transport: Transport | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2),
    ) -> None:
        self.settings = settings
        self._delivery = Delivery(settings, "metrics", transport, monotonic=monotonic, jitter=jitter)
        self.dropped = 0

    def export(self, resource: Mapping[str, Any], scopes: Sequence[ScopeData], timeout: float) -> bool:
        if self._delivery.stopped:
            return False
        if self._delivery.send(encode_metrics(resource, scopes, release_gil), timeout):
            return True
        self.dropped += 1
        return False

    def shutdown(self) -> None:
        self._delivery.shutdown()


class ConsoleMetricExporter:
    """Each export as one line of OTLP/JSON on `stream` (stdout, as it is at the time of the export)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def export(self, resource: Mapping[str, Any], scopes: Sequence[ScopeData], timeout: float) -> bool:
        stream = self._stream or sys.stdout
        stream.write(json.dumps(json_metrics(resource, scopes), separators=(",", ":")) + "\n")
        stream.flush()
        return True

    def shutdown(self) -> None:
        pass


class MetricPipeline:
    """Meters of one resource; with an exporter, exported every `interval` seconds from a thread of its own."""

    def __init__(
        self,
        resource: Mapping[str, Any],
        exporter: MetricExporter | None = None,
        *,
        interval: float = DEFAULT_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        temporality: Temporality = Temporality.CUMULATIVE,
        limit: int = CARDINALITY_LIMIT,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.resource = dict(resource)
        self.exporter = exporter
        self.interval = interval
        self.timeout = timeout
        self.temporality = temporality
        self._limit = limit
        self._clock = clock
        self._meters: dict[tuple[str, str, str], Meter] = {}
        self._export_lock = threading.Lock()
        self._stop = threading.Event()
        self._final_timeout = timeout
        self._closed = False
        self._next_failure_log = 0.0
        self._thread: threading.Thread | None = None
        if exporter is not None:
            self._thread = threading.Thread(target=self._run, name="taotrace-metrics-export", daemon=True)
            self._thread.start()

    def get_meter(self, name: str, version: str, schema_url: str) -> Meter:
        """The meter of this scope (one per name, version and schema URL)."""
        key = (name, version, schema_url)
        meter = self._meters.get(key)
        if meter is None:
            meter = self._meters[key] = Meter(
                name, version, schema_url, self.temporality, clock=self._clock, limit=self._limit
            )
        return meter

    def collect(self) -> list[ScopeData]:
        """Every scope with points, in the order the meters were made (delta: starts the next interval)."""
        return [s for s in (m.collect() for m in list(self._meters.values())) if s is not None]

    def export(self, timeout: float | None = None) -> bool:
        """Collect and export once (nothing to send: True); False when the exporter failed."""
        if self.exporter is None:
            return True
        with self._export_lock:
            scopes = self.collect()
            if not scopes:
                return True
            try:
                return self.exporter.export(self.resource, scopes, self.timeout if timeout is None else timeout)
            except Exception as error:  # noqa: BLE001 - an export never stops the thread
                now = time.monotonic()
                if now >= self._next_failure_log:  # at most one line a minute, never a traceback each interval
                    self._next_failure_log = now + 60.0
                    log.warning("OTLP metrics export failed: %s", type(error).__name__)
                return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.export()
        if not self._closed:
            self.export(min(self.timeout, self._final_timeout))  # the last interval

    def shutdown(self, timeout: float = 3.0) -> bool:
        """Export the last interval, waiting at most `timeout` s; False if that did not finish."""
        if self._stop.is_set():
            return True
        self._final_timeout = timeout
        self._stop.set()
        finished = True
        if self._thread is not None:
            self._thread.join(timeout)
            finished = not self._thread.is_alive()
        self._closed = True
        if self.exporter is not None:
            # Ends a back-off wait still under way at once. From a thread of its own: closing the
            # transport waits for an export stuck on a collector that accepts and never answers.
            threading.Thread(target=self.exporter.shutdown, name="taotrace-metrics-close", daemon=True).start()
        return finished
