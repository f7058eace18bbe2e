"""`taotrace serve`: the composition root. It checks the settings once, then runs the proxy in
this process (`running`) or as a group of workers (`proxy.workers.supervisor.supervising`), until
SIGTERM/SIGINT, then drains and exits.

    one process   Reporting (metrics port, spans, GenAI metrics, live view) + serving (proxy port)
    a group       Reporting (no port) + serving in each worker; the metrics port in the supervisor,
                  which merges the workers' metrics and asks their live views

Both ports are bound before anything else starts; one that cannot be had is one line and exit 2.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from proxy.config.config import Config, load
from proxy.config.settings import Settings
from proxy.dialects import DIALECTS, Dialects
from proxy.exchange.inflight import InFlightRequests
from proxy.exchange.mirror import describe
from proxy.exchange.record import RequestRecord
from proxy.logs.origin import without_credentials
from proxy.reporting.reporting import Reporting
from proxy.server.app import mirror_policy
from proxy.server.banner import live_view_warning, startup_line
from proxy.server.hints import endpoint_suffix
from proxy.server.lifecycle import LOOP_SWITCH_INTERVAL, Shutdown, configure_logging, run_loop, settle_heap
from proxy.server.listen import CannotListen, bind
from proxy.server.serving import serving
from proxy.telemetry.metric_pipeline import MetricPipeline
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.otlp_env import span_destination
from proxy.telemetry.tracing import Tracing, TracingError
from proxy.ui import LiveView
from proxy.workers.supervisor import supervising

__all__ = ["LOOP_SWITCH_INTERVAL", "Running", "Settings", "configure_logging", "run", "running", "serve", "serve_group"]

log = logging.getLogger("taotrace")


@dataclass(frozen=True)
class Running:
    """A started proxy: where it listens, and what it records to."""

    proxy_url: str
    metrics_url: str
    registry: CollectorRegistry
    requests: InFlightRequests  # this process's requests in flight (and whether it drains)
    metrics: Metrics
    live: LiveView | None = None  # the live view, unless --no-ui
    metrics_addresses: tuple[str, ...] = ()  # what the metrics port is bound to (is the live view exposed?)


@asynccontextmanager
async def running(
    settings: Settings | Config,
    *,
    on_record: Callable[[RequestRecord], None] | None = None,
    tracing: Tracing | None = None,
    registry: CollectorRegistry | None = None,
    meter_provider: MetricPipeline | None = None,
    stop_now: asyncio.Event | None = None,
    dialects: Dialects = DIALECTS,
) -> AsyncIterator[Running]:
    """The proxy in this process: both ports (port 0 allowed); drain and stop on exit.

    `settings`: as given, or the configuration already loaded from them (`proxy.config.config`).
    `meter_provider`: where the OTLP GenAI metrics go; by default one built from `OTEL_*`
    (none unless `OTEL_METRICS_EXPORTER` asks for it). A provider passed in is not shut down.
    `stop_now`: once set (a second signal), the drain cuts what is in flight at once.
    `dialects`: the APIs the proxy reads (`proxy/dialects/`); every other path is `other`."""
    config = settings if isinstance(settings, Config) else load(settings)
    s = config.settings
    # Every port first: one that cannot be had stops the start here, before exporters, threads
    # or a drain exist.
    proxy_socks = bind(s.host, s.port, port_flag="--port", host_flag="--host", backlog=2048)
    metrics_socks: list[socket.socket] = []
    try:
        metrics_socks = bind(s.metrics_host, s.metrics_port, port_flag="--metrics-port", host_flag="--metrics-host")
        reporting = Reporting(
            config, on_record=on_record, registry=registry, tracing=tracing, meter_provider=meter_provider
        )
        requests = InFlightRequests()
        try:
            await reporting.start(
                metrics_socks,
                readiness=lambda: "draining" if requests.draining else "ready",
                in_flight=lambda: len(requests.tasks),
                active=requests.snapshot,
            )
            async with serving(
                config, proxy_socks, requests, spans=reporting.spans, recorder=reporting.metrics,
                observers=reporting.observers, stop_now=stop_now, dialects=dialects,
                mirror_dropped=lambda reason: reporting.metrics.mirror.dropped.labels(reason).inc(),
            ) as proxy_url:  # fmt: skip
                yield Running(
                    proxy_url, reporting.metrics_url, reporting.registry, requests, reporting.metrics, reporting.live,
                    reporting.metrics_addresses,
                )  # fmt: skip
        finally:
            await reporting.close(hurried=stop_now is not None and stop_now.is_set())
    finally:
        for sock in proxy_socks + metrics_socks:
            sock.close()


async def serve(config: Config) -> None:
    """The proxy in this process, until SIGTERM or SIGINT."""
    settings = config.settings
    sys.setswitchinterval(LOOP_SWITCH_INTERVAL)  # see lifecycle.py
    shutdown = Shutdown().install()
    async with running(config, stop_now=shutdown.now) as srv:
        # Everything built at start (modules, apps, pools) leaves the collector's reach, so a full
        # garbage collection walks only what requests create: a shorter pause of the loop when
        # the OTLP collector is down and spans sit queued for seconds (docs/performance.md).
        settle_heap()
        announce(config, srv.proxy_url, srv.metrics_url, srv.metrics_addresses, ui=srv.live is not None)
        await shutdown.wait()
        n = len(srv.requests.tasks)
        log.info(
            "draining: up to %gs for %d request%s in flight; a second Ctrl-C or SIGTERM cuts them now",
            settings.drain_seconds,
            n,
            "" if n == 1 else "s",
        )


async def serve_group(config: Config) -> None:
    """`--workers N`: the group, until SIGTERM or SIGINT, then drained."""
    settings = config.settings
    shutdown = Shutdown().install()
    async with supervising(config, shutdown=shutdown) as group:
        workers = f"{settings.workers} workers"
        if not shutdown.requested.is_set():  # a Ctrl-C while the workers started: straight to the drain
            pids = " ".join(map(str, group.pids()))
            processes = f"({workers}, pids {pids}; /metrics and the live view in pid {os.getpid()})"
            announce(
                config, group.proxy_url, group.metrics_url, group.metrics_addresses, ui=settings.ui,
                processes=processes,
            )  # fmt: skip
        await shutdown.wait()
        log.info("draining %s: up to %gs; a second Ctrl-C or SIGTERM cuts them now", workers, settings.drain_seconds)


def mirror_notice(config: Config) -> str:
    """What `--mirror` costs and who gets the copies ("" when off)."""
    policy = mirror_policy(config)
    if policy is None:
        return ""
    route = config.route(policy.route)
    settings = config.settings
    return describe(policy, str(route.url.with_user(None)).rstrip("/"), settings.mirror_key_env, settings.workers)


def describe_routes(config: Config) -> str:
    """`/anthropic -> https://api.anthropic.com (anthropic), / -> ...`: where each prefix goes."""
    return ", ".join(
        f"{r.shown_prefix} -> {r.url.with_user(None).with_password(None)} ({r.name})" for r in config.routes
    )


def announce(
    config: Config,
    proxy_url: str,
    metrics_url: str,
    metrics_addresses: Sequence[str],
    *,
    ui: bool,
    processes: str = "",
) -> None:
    """The startup line (one process or a group's supervisor), after the live view's exposure warning."""
    settings = config.settings
    token = settings.ui_token is not None
    warning = live_view_warning(
        metrics_url, metrics_addresses, ui=ui, token=token, capture_content=settings.capture_content
    )
    if warning is not None:
        log.warning("%s", warning)
    line = startup_line(
        proxy_url=proxy_url,
        # The route for every other path (--upstream, or --route /=URL); userinfo holds a password.
        upstream=str(without_credentials(config.root.url)),
        metrics_url=metrics_url,
        ui=ui,
        ui_token=token,
        spans=span_destination(os.environ),
        processes=processes,
    )
    log.info("%s", line)
    if settings.routes:
        log.info("routes: %s", describe_routes(config))


def run(settings: Settings) -> int:
    """The `taotrace serve` command: one process, or a group (`--workers` > 1)."""
    configure_logging(settings.log_level)
    try:
        # Loaded once for the whole start (one salt for taotrace.key.id in every process of a
        # group); a bad --prices file, --metric-label, route or HTTPS_PROXY stops here, with its reason.
        config = load(settings)
    except ValueError as exc:  # never the proxy's credentials: the messages are built without them
        log.error("%s", exc)
        return 2
    mirror = mirror_notice(config)
    if mirror:
        log.warning("%s", mirror)
    routes = config.routes
    for route in routes:
        glued = endpoint_suffix(route.url)
        if glued is not None:
            log.warning("%s%s", "" if len(routes) == 1 else f"route {route.name}: ", glued)
    for route, forward in zip(routes, config.forward, strict=True):
        if forward is not None:
            where = "the upstream" if len(routes) == 1 else f"upstream {route.name}"
            log.info("%s is reached through the %s", where, forward.where)
    try:
        if settings.workers > 1:
            run_loop(serve_group(config))
        else:
            run_loop(serve(config))
    except (CannotListen, TracingError) as exc:  # one line: the address and the flag, or the OTEL_* variable
        log.error("%s", exc)
        return 2
    except OSError as exc:
        log.error("cannot serve: %s", exc)
        return 1
    return 0
