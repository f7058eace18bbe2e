"""The reporting side of a serving process, built once: one process's, or a group's worker's.

    Reporting(config)
      metrics      the `taotrace_*` families on their registry
      spans        started and ended here, exported by this process
      observers    fed every finished record: the caller's, the OTLP GenAI metrics, the live view
      start(...)   the metrics port: /metrics /healthz /readyz and the live view (none in a worker,
                   whose supervisor serves the group's: `MetricsPort`)
      close(hurried)  the metrics port stops, queued GenAI metrics are recorded, spans and OTLP
                      metrics flush (both at once, each bounded; `hurried`: a second signal came)

A worker's spans and OTLP metrics leave under the group's resource with its own
`service.instance.id` (`instance`). Providers and a registry passed in belong to the caller and
are not shut down.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack

from aiohttp import web
from opentelemetry.sdk.resources import Resource as SdkResource
from prometheus_client import CollectorRegistry

from proxy.config.accounting import label_name
from proxy.config.config import Config
from proxy.exchange.observers import Named
from proxy.exchange.protocol import GuardedAppRunner
from proxy.exchange.record import RequestRecord
from proxy.server.app import create_metrics_app
from proxy.server.listen import http_url
from proxy.telemetry.collector_log import collector_warnings
from proxy.telemetry.genai_metrics import GenAIMetrics, build_meter_provider, shutdown_meter_provider
from proxy.telemetry.metric_pipeline import MetricPipeline
from proxy.telemetry.metrics import Metrics, ModelLabels
from proxy.telemetry.sampling import OutcomeSampling
from proxy.telemetry.semconv import Conventions
from proxy.telemetry.spandata import Resource
from proxy.telemetry.spans import Spans
from proxy.telemetry.tracing import Tracing, build_tracing, shutdown_tracing
from proxy.ui import LiveView
from proxy.ui.live import Active, LiveSource

__all__ = [
    "HURRIED_SHUTDOWN_SECONDS", "TRACE_SHUTDOWN_SECONDS", "MetricsPort", "Reporting", "genai_metrics_for",
    "metrics_for", "spans_for",
]  # fmt: skip

log = logging.getLogger("taotrace")
# The last span flush at exit. A healthy collector takes milliseconds; a dead one gets this long,
# so exit comes just after drain_seconds + this even when streams run to the deadline
# (docs/reliability.md).
TRACE_SHUTDOWN_SECONDS = 2.0
HURRIED_SHUTDOWN_SECONDS = 0.5  # the same after a second signal: cut now means now


def metrics_for(config: Config, registry: CollectorRegistry | None) -> Metrics:
    """The `taotrace_*` families this configuration asks for."""
    settings, accounting = config.settings, config.accounting
    return Metrics(
        registry,
        ModelLabels(frozenset(settings.model_allowlist), settings.max_models),
        attribute_labels=[(name, label_name(name)) for name in accounting.metric_labels],
        attribute_label_values=accounting.metric_label_values,
    )


def spans_for(config: Config, tracing: Tracing, *, env: Mapping[str, str] | None = None) -> Spans:
    """The spans this configuration asks for, started and ended in the serving process and
    exported by `tracing`. `env`: where `OTEL_SEMCONV_STABILITY_OPT_IN` is read (default the
    process environment)."""
    settings, root = config.settings, config.root
    return Spans(
        tracing,
        upstream_host=root.host,
        upstream_port=root.port,
        upstream_base=root.base,
        capture_content=settings.capture_content,
        capture_io_values=settings.capture_io_values,
        sampling=OutcomeSampling(
            ratio=settings.sample_ratio,
            keep_errors=settings.keep_errors,
            ttft_over=config.slow_ttft,
            duration_over=config.slow_duration,
        ),
        parent=settings.parent,
        conventions=Conventions.from_env(os.environ if env is None else env),
    )


def genai_metrics_for(
    config: Config,
    meters: MetricPipeline,
    models: ModelLabels,
    env: Mapping[str, str] | None = None,
) -> GenAIMetrics:
    """The OTLP GenAI metrics observer; `server.*` per route; the convention names
    `OTEL_SEMCONV_STABILITY_OPT_IN` in `env` asks for."""
    root = config.root
    return GenAIMetrics(
        meters,
        server_address=root.host,
        server_port=root.port,
        models=models,
        upstreams={r.name: (r.host, r.port) for r in config.routes},
        conventions=Conventions.from_env(os.environ if env is None else env),
    )


class MetricsPort:
    """/metrics, /healthz, /readyz and the live view, on sockets already bound."""

    def __init__(self) -> None:
        self.url = ""
        self.addresses: tuple[str, ...] = ()  # what it is bound to (is the live view exposed?)
        self._runner: web.AppRunner | None = None

    async def start(
        self,
        socks: Sequence[socket.socket],
        config: Config,
        pages: Callable[[bool], Iterable[bytes]],
        readiness: Callable[[], str],
        live: LiveSource | None,
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Serve `pages` (after `refresh`, when given: a group asks its workers first), `readiness`
        for /readyz, and `live` for the live view."""
        settings = config.settings
        token = settings.ui_token.get_secret_value() if settings.ui_token is not None else None
        app = create_metrics_app(pages, readiness, live, ui_token=token, proxy_port=settings.port, refresh=refresh)
        self._runner = GuardedAppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        for sock in socks:
            await web.SockSite(self._runner, sock).start()
        if socks:
            self.url = http_url(*self._runner.addresses[0][:2])
        self.addresses = tuple(str(address[0]) for address in self._runner.addresses)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class Reporting:
    """Metrics, spans, GenAI metrics and the live view of one start, and the port that serves them."""

    def __init__(
        self,
        config: Config,
        *,
        on_record: Callable[[RequestRecord], None] | None = None,
        registry: CollectorRegistry | None = None,
        meter_provider: MetricPipeline | None = None,
        tracing: Tracing | None = None,
        env: Mapping[str, str] = os.environ,
        instance: str | None = None,
    ) -> None:
        """`tracing` / `meter_provider`: where spans and OTLP metrics go; by default
        built from `env`'s `OTEL_*` (OTLP metrics: none unless `OTEL_METRICS_EXPORTER` asks).
        `instance`: this process's `service.instance.id` (a group's worker), on the resource of
        the spans and OTLP metrics built here."""
        self.config = config
        settings = self.settings = config.settings
        self.registry = CollectorRegistry() if registry is None else registry
        self.metrics = metrics_for(config, self.registry)
        self._own_tracing = tracing is None
        self.tracing = build_tracing(env, on_drop=self.metrics.span_dropped) if tracing is None else tracing
        self._own_meters = meter_provider is None
        self.meters = build_meter_provider(env) if meter_provider is None else meter_provider
        if instance is not None:
            own = {"service.instance.id": instance}
            resource = self.tracing.resource
            self.tracing = dataclasses.replace(
                self.tracing, resource=Resource({**resource.attributes, **own}, resource.schema_url)
            )
            if self._own_meters and self.meters is not None:  # before its first export, an interval away
                self.meters.resource = self.meters.resource.merge(SdkResource(own))
        self.spans = spans_for(config, self.tracing, env=env)
        self._env = env
        # Named: a sink that fails is counted under its name in taotrace_sink_errors_total{sink}.
        observers: list[Named[RequestRecord]] = [] if on_record is None else [Named("on_record", on_record)]
        self.genai: GenAIMetrics | None = None
        if self.meters is not None:
            self.genai = genai_metrics_for(config, self.meters, self.metrics.models, env)
            observers.append(Named("genai_metrics", self.genai))
        self.live: LiveView | None = None
        if settings.ui:
            self.live = LiveView(
                settings.ui_requests, capture_content=settings.capture_content, trace_url=settings.trace_url
            )
            observers.append(Named("live_view", self.live.observe))
        self.observers: tuple[Named[RequestRecord], ...] = tuple(observers)
        self.port = MetricsPort()
        self._exit = AsyncExitStack()

    @property
    def metrics_url(self) -> str:
        return self.port.url

    @property
    def metrics_addresses(self) -> tuple[str, ...]:
        return self.port.addresses

    async def start(
        self,
        socks: Sequence[socket.socket],
        *,
        readiness: Callable[[], str],
        in_flight: Callable[[], int],
        active: Active,
    ) -> None:
        """Serve the metrics port on `socks` (already bound; none in a group's worker): `readiness`
        for /readyz, and for the live view the number of requests in flight and what they are."""
        if self.live is not None:
            self.live.in_flight, self.live.active = in_flight, active
        # The exporters' own warnings become rate-limited lines of ours, until the last flush at exit.
        exporting = self._own_tracing or self._own_meters
        await self._exit.enter_async_context(collector_warnings(self._env if exporting else {}, log))
        if socks:
            await self.port.start(socks, self.config, self.metrics.registry.pages, readiness, self.live)

    async def close(self, hurried: bool) -> None:
        """Stop the metrics port, then flush: within ~2 s with a dead collector, 0.5 s `hurried`."""
        try:
            await self.port.close()
            wait = HURRIED_SHUTDOWN_SECONDS if hurried else TRACE_SHUTDOWN_SECONDS
            if self.genai is not None:
                await asyncio.to_thread(self.genai.stop, wait)  # what is queued gets recorded
            flushes = []  # both exports at once: exit stays within drain_seconds + ~2 s
            if self._own_meters and self.meters is not None:
                flushes.append(asyncio.to_thread(shutdown_meter_provider, self.meters, wait))
            if self._own_tracing:
                flushes.append(asyncio.to_thread(shutdown_tracing, self.tracing, wait))
            await asyncio.gather(*flushes)
        finally:
            await self._exit.aclose()
