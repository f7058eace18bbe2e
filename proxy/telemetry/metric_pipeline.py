"""Our meters (`aggregate.py`), collected every interval and handed to the SDK's metric exporters.

`MetricPipeline` owns the meters of one resource and, when given exporters, a thread that
collects every `interval` seconds (`OTEL_METRIC_EXPORT_INTERVAL`) and hands the points to each
exporter as the SDK's export data (`MetricsData`), with `timeout` (`OTEL_METRIC_EXPORT_TIMEOUT`).
`shutdown` exports the last interval but returns after its own timeout whatever the collector
does. The exporters are OpenTelemetry's (`exporters_from_env`): OTLP over gRPC or HTTP/protobuf,
the console, or any registered under the SDK's entry-point group; they encode, compress, send
and retry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource

from proxy.telemetry.aggregate import CARDINALITY_LIMIT, Meter
from proxy.telemetry.otlp_env import otlp_target

__all__ = ["ENTRY_POINTS", "MetricPipeline", "exporters_from_env"]

log = logging.getLogger("taotrace")
_logger = logging.getLogger(__name__)  # collector_log.LOGGERS lists it

DEFAULT_INTERVAL = 60.0  # seconds: the spec's default OTEL_METRIC_EXPORT_INTERVAL
DEFAULT_TIMEOUT = 30.0  # seconds: the spec's default OTEL_METRIC_EXPORT_TIMEOUT
ENTRY_POINTS = "opentelemetry_metrics_exporter"  # where the SDK finds exporters by name
# OTEL_METRICS_EXPORTER's OTLP names -> the protocol each uses unless OTEL_EXPORTER_OTLP_*PROTOCOL
# says another (`otlp`: the spec's default, http/protobuf) ...
_OTLP_NAMES = {"otlp": "http/protobuf", "otlp_proto_http": "http/protobuf", "otlp_proto_grpc": "grpc"}
# ... and each protocol's exporter, by its entry-point name.
_OTLP_EXPORTERS = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}


def _exporter(name: str, env: Mapping[str, str]) -> MetricExporter | None:
    """The exporter registered as `name`; an OTLP one only with an endpoint. None, logged, when
    there is none to make."""
    options: dict[str, str] = {}
    if name in _OTLP_NAMES:
        target = otlp_target({"OTEL_EXPORTER_OTLP_PROTOCOL": _OTLP_NAMES[name], **env}, "metrics")
        if target is None:
            return None  # no endpoint, no network export (the SDK's would try localhost)
        protocol, options["endpoint"] = target
        if protocol not in _OTLP_EXPORTERS:  # never protobuf sent where something else was asked for
            log.warning(
                "OTLP metrics are not exported: protocol %r is not one of OpenTelemetry's Python exporters "
                "(grpc, http/protobuf)",
                protocol,
            )
            return None
        name = _OTLP_EXPORTERS[protocol]
    found = list(entry_points(group=ENTRY_POINTS, name=name))
    if not found:
        log.warning("OTEL_METRICS_EXPORTER: no metrics exporter %r is installed (entry points %s)", name, ENTRY_POINTS)
        return None
    made = found[0].load()
    if not (isinstance(made, type) and issubclass(made, MetricExporter)):
        # A MetricReader (Prometheus') collects from SDK instruments: ours are not, and /metrics serves them.
        log.warning("OTEL_METRICS_EXPORTER: %r is not a metrics exporter; skipped", name)
        return None
    factory: Callable[..., MetricExporter] = made  # an OTLP exporter takes `endpoint`
    return factory(**options)


def exporters_from_env(env: Mapping[str, str]) -> list[MetricExporter]:
    """`OTEL_METRICS_EXPORTER`'s exporters, a comma list (`none` by default: export is opt-in).
    `otlp` is OTLP over the protocol `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL` or
    `OTEL_EXPORTER_OTLP_PROTOCOL` names (`http/protobuf` by default, or `grpc`), to the endpoint
    their `*_ENDPOINT` name (no endpoint: no OTLP exporter); the exporter reads its other
    `OTEL_EXPORTER_OTLP_*` variables itself. Any other name is looked up as the SDK does."""
    names = (n.strip().lower() for n in env.get("OTEL_METRICS_EXPORTER", "none").split(","))
    made = (_exporter(name, env) for name in dict.fromkeys(names) if name not in ("", "none"))
    return [e for e in made if e is not None]


class MetricPipeline:
    """Meters of one resource; with exporters, exported every `interval` seconds from a thread of its own."""

    def __init__(
        self,
        resource: Resource | None = None,
        exporters: Sequence[MetricExporter] = (),
        *,
        interval: float = DEFAULT_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        temporality: AggregationTemporality = AggregationTemporality.CUMULATIVE,
        limit: int = CARDINALITY_LIMIT,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.resource = Resource.get_empty() if resource is None else resource
        self.exporters = tuple(exporters)
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
        if self.exporters:
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

    def collect(self) -> list[ScopeMetrics]:
        """Every scope with points, in the order the meters were made (delta: starts the next interval)."""
        return [s for s in (m.collect() for m in list(self._meters.values())) if s is not None]

    def export(self, timeout: float | None = None) -> bool:
        """Collect once and hand it to each exporter (nothing to send: True); False when one failed."""
        if not self.exporters:
            return True
        with self._export_lock:
            scopes = self.collect()
            if not scopes:
                return True
            data = MetricsData([ResourceMetrics(self.resource, scopes, self.resource.schema_url)])
            millis = 1000 * (self.timeout if timeout is None else timeout)
            ok = True
            for exporter in self.exporters:
                try:
                    ok = exporter.export(data, timeout_millis=millis) is MetricExportResult.SUCCESS and ok
                except Exception as error:  # noqa: BLE001 - an export never stops the thread
                    ok = False
                    now = time.monotonic()
                    if now >= self._next_failure_log:  # at most one line a minute, never a traceback each interval
                        self._next_failure_log = now + 60.0
                        # The exception as an argument: collector_log makes its cause our line when
                        # an OTLP endpoint is set (its text may name the endpoint's URL). After a
                        # shutdown that gave up on it, the exit's own line has said what was lost.
                        level = logging.DEBUG if self._closed else logging.WARNING
                        _logger.log(level, "Failed to export %s: %s", "metrics", error)
            return ok

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
        if self.exporters:
            # Ends a back-off wait still under way. From a thread of its own: an exporter's
            # shutdown may wait for an export stuck on a collector that accepts and never answers.
            closing = threading.Thread(target=self._close, name="taotrace-metrics-close", daemon=True)
            closing.start()
            closing.join(min(0.1, timeout))  # an abandoned retry's last words, while collector_log listens
        return finished

    def _close(self) -> None:
        for exporter in self.exporters:
            try:
                exporter.shutdown()
            except Exception:
                _logger.debug("a metrics exporter failed to shut down", exc_info=True)
