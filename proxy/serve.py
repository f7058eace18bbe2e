"""`taotrace serve`: start both ports, serve until SIGTERM/SIGINT, then drain and exit.

Drain: /readyz turns 503 and the proxy's listening socket closes at once (new connections are
refused); requests in flight get `drain_seconds` to finish; any still running are cancelled,
which closes their client connections mid-body (cut, never cleanly truncated).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry

from proxy.accounting.config import accounting_from, label_name
from proxy.app import ServerState, create_metrics_app, create_proxy_app, mirror_policy, upstream_url
from proxy.banner import exposed, exposure_warning, startup_line
from proxy.dialects import DIALECTS, Dialects
from proxy.envproxy import forward_proxy_for
from proxy.lifecycle import Drained, Shutdown, drain, run_loop
from proxy.listen import CannotListen, bind
from proxy.logs.origin import without_credentials
from proxy.mirror import describe
from proxy.protocol import GuardedAppRunner
from proxy.record import RequestRecord
from proxy.routes import default_route_conflict, routes_for
from proxy.settings import Settings, parse_thresholds
from proxy.sinks import Named
from proxy.telemetry.accesslog import AccessLog
from proxy.telemetry.collector_log import collector_warnings
from proxy.telemetry.genai_metrics import GenAIMetrics, build_meter_provider, shutdown_meter_provider
from proxy.telemetry.metrics import Metrics, ModelLabels, Recorder
from proxy.telemetry.otlp_env import span_destination
from proxy.telemetry.sampling import OutcomeSampling
from proxy.telemetry.semconv import Conventions
from proxy.telemetry.spans import Telemetry, build_tracer_provider, shutdown_tracer_provider
from proxy.ui import LiveView

__all__ = ["Running", "Settings", "run", "running"]

log = logging.getLogger("taotrace")
# The last span flush at exit. A healthy collector takes milliseconds; a dead one gets 2 s, so
# exit comes within drain_seconds + ~2.1 s even when streams run to the deadline (3 s made 5.05 s).
TRACE_SHUTDOWN_SECONDS = 2.0
HURRIED_SHUTDOWN_SECONDS = 0.5  # the same after a second signal: cut now means now
LOOP_SWITCH_INTERVAL = 0.001  # seconds; see serve()


@dataclass(frozen=True)
class Running:
    """A started proxy: where it listens, and what it records to."""

    proxy_url: str
    metrics_url: str
    registry: CollectorRegistry
    state: ServerState
    metrics: Metrics
    live: LiveView | None = None  # the live view, unless --no-ui
    metrics_addresses: tuple[str, ...] = ()  # what the metrics port is bound to (is the live view exposed?)


def _bound_url(runner: web.AppRunner) -> str:
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"


async def _drain(runner: web.AppRunner, state: ServerState, deadline: float, now: asyncio.Event | None) -> Drained:
    """Refuse new connections at once, let requests in flight run until the deadline (or until
    `now` is set: a second signal), then cancel the rest (their clients see the connection cut,
    never a clean end). aiohttp's own shutdown is not enough: it waits `shutdown_timeout`, then
    cancels only the request's body reader and waits `shutdown_timeout` again, so a stream could
    run for twice the deadline."""
    for site in list(runner.sites):
        await site.stop()
    if runner.server is not None:
        runner.server.pre_shutdown()  # idle keep-alive connections: closed, so they bring no new requests
    return await drain(state.in_flight, deadline, now)


def metrics_for(settings: Settings, registry: CollectorRegistry | None) -> Metrics:
    """The `taotrace_*` families these settings ask for (one process, or a group's supervisor)."""
    accounting = accounting_from(settings)
    return Metrics(
        registry,
        ModelLabels(frozenset(settings.model_allowlist), settings.max_models),
        attribute_labels=[(name, label_name(name)) for name in accounting.metric_labels],
        attribute_label_values=accounting.metric_label_values,
    )


def telemetry_for(
    settings: Settings, provider: trace.TracerProvider, *, ship: bool = False, env: Mapping[str, str] | None = None
) -> Telemetry:
    """The spans these settings ask for: started and finished in one process, started only
    (`ship`: a worker), or, in a group's supervisor, finished from what workers ship (`replay`).
    `env`: where `OTEL_SEMCONV_STABILITY_OPT_IN` is read (default the process environment)."""
    upstream = upstream_url(settings.upstream)
    slow_ttft, slow_duration = parse_thresholds(settings.keep_slower_than)
    return Telemetry(
        provider,
        upstream_host=upstream.host or "",
        upstream_port=upstream.port or 0,
        upstream_base=str(upstream).rstrip("/"),
        capture_content=settings.capture_content,
        sampling=OutcomeSampling(
            ratio=settings.sample_ratio,
            keep_errors=settings.keep_errors,
            ttft_over=slow_ttft,
            duration_over=slow_duration,
        ),
        ship=ship,
        parent=settings.parent,
        conventions=Conventions.from_env(os.environ if env is None else env),
    )


def genai_metrics_for(
    settings: Settings, meters: MeterProvider, models: ModelLabels, env: Mapping[str, str] | None = None
) -> GenAIMetrics:
    """The OTLP GenAI metrics observer (one process, or a group's supervisor); `server.*` per route;
    the convention names `OTEL_SEMCONV_STABILITY_OPT_IN` in `env` asks for."""
    upstream = upstream_url(settings.upstream)
    return GenAIMetrics(
        meters,
        server_address=upstream.host or "",
        server_port=upstream.port or 0,
        models=models,
        upstreams={r.name: (r.host, r.port) for r in routes_for(settings.upstream, settings.routes)},
        conventions=Conventions.from_env(os.environ if env is None else env),
    )


@asynccontextmanager
async def running(
    settings: Settings,
    *,
    on_record: Callable[[RequestRecord], None] | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    registry: CollectorRegistry | None = None,
    meter_provider: MeterProvider | None = None,
    stop_now: asyncio.Event | None = None,
    recorder: Recorder | None = None,
    ship_spans: bool = False,
    dialects: Dialects = DIALECTS,
) -> AsyncIterator[Running]:
    """Start the proxy and metrics servers (port 0 allowed); drain and stop on exit.

    `meter_provider`: where the OTLP GenAI metrics go; by default one built from `OTEL_*`
    (none unless `OTEL_METRICS_EXPORTER` asks for it). A provider passed in is not shut down.
    `stop_now`: once set (a second signal), the drain cuts what is in flight at once.
    `recorder`: a worker of `--workers N` (proxy/workers/): finished requests go to it instead
    of local metrics, no metrics port is opened (the supervisor has it) and the proxy port is
    bound with SO_REUSEPORT, shared with the other workers; its OTLP metrics are the supervisor's.
    A worker exports no spans: with `ship_spans` it starts them here and the supervisor finishes
    and exports them from each record's `span` (`Telemetry.replay`); without, the group exports none.
    `dialects`: the APIs the proxy reads (`proxy/dialects/`); every other path is `other`.
    """
    worker = recorder is not None
    # Every port first: one that cannot be had stops the start here, before exporters, threads
    # or a drain exist (a worker's port is the group's, held by its supervisor).
    proxy_socks = bind(
        settings.host, settings.port, port_flag="--port", host_flag="--host", backlog=2048, reuse_port=worker
    )
    metrics_socks: list[socket.socket] = []
    try:
        if not worker:
            metrics_socks = bind(
                settings.metrics_host, settings.metrics_port, port_flag="--metrics-port", host_flag="--metrics-host"
            )
        async with _serving(
            settings, proxy_socks, metrics_socks, on_record=on_record, tracer_provider=tracer_provider,
            registry=registry, meter_provider=meter_provider, stop_now=stop_now, recorder=recorder,
            ship_spans=ship_spans, dialects=dialects,
        ) as srv:  # fmt: skip
            yield srv
    finally:
        for sock in proxy_socks + metrics_socks:
            sock.close()


@asynccontextmanager
async def _serving(
    settings: Settings,
    proxy_socks: list[socket.socket],
    metrics_socks: list[socket.socket],
    *,
    on_record: Callable[[RequestRecord], None] | None,
    tracer_provider: trace.TracerProvider | None,
    registry: CollectorRegistry | None,
    meter_provider: MeterProvider | None,
    stop_now: asyncio.Event | None,
    recorder: Recorder | None,
    ship_spans: bool,
    dialects: Dialects,
) -> AsyncIterator[Running]:
    """`running`, on sockets already bound."""
    worker = recorder is not None
    own_provider = tracer_provider is None
    own_meters = meter_provider is None and not worker
    meters = build_meter_provider() if own_meters else meter_provider
    provider = build_tracer_provider(export=not worker) if tracer_provider is None else tracer_provider
    registry = CollectorRegistry() if registry is None else registry
    telemetry = telemetry_for(settings, provider, ship=ship_spans)
    accounting = accounting_from(settings)
    metrics = metrics_for(settings, registry)
    sink: Recorder = metrics if recorder is None else recorder
    state = ServerState()
    # Named: a sink that fails is counted under its name in taotrace_sink_errors_total{sink}.
    observers: list[Named[RequestRecord]] = [] if on_record is None else [Named("on_record", on_record)]
    if settings.access_log:
        observers.append(Named("access_log", AccessLog(logging.getLogger("taotrace.access"))))
    genai = None
    if meters is not None:
        genai = genai_metrics_for(settings, meters, metrics.models)
        observers.append(Named("genai_metrics", genai))
    live = None
    if settings.ui and not worker:  # a worker's records reach the supervisor's live view instead
        live = LiveView(
            settings.ui_requests,
            in_flight=lambda: len(state.in_flight),
            active=state.requests.ask,
            capture_content=settings.capture_content,
        )
        observers.append(Named("live_view", live.observe))
    proxy_runner = GuardedAppRunner(  # parse errors answered without quoting the request (secrets)
        create_proxy_app(
            settings,
            telemetry,
            sink,
            state,
            observers,
            accounting,
            mirror_dropped=lambda reason: metrics.compare.dropped.labels(reason).inc(),
            dialects=dialects,
        ),
        handler_cancellation=True,  # a client that leaves cancels its upstream call
        access_log=None,  # aiohttp's access log prints query strings (`?key=`)
        shutdown_timeout=settings.drain_seconds,
        # aiohttp's default (3630 s) let a client hold a connection for an hour by sending half a
        # request head (slowloris); this bounds idle and unfinished connections alike.
        keepalive_timeout=settings.client_keepalive,
    )
    token = settings.ui_token.get_secret_value() if settings.ui_token is not None else None
    metrics_app = create_metrics_app(
        metrics.registry.render,
        lambda: "draining" if state.draining else "ready",
        live,
        ui_token=token,
        trace_url=settings.trace_url,
    )
    metrics_runner = GuardedAppRunner(metrics_app, access_log=None, shutdown_timeout=1.0)
    await proxy_runner.setup()
    await metrics_runner.setup()
    # The exporters' own warnings become rate-limited lines of ours, until the last flush at exit.
    exporting = own_meters or (own_provider and not worker)
    async with collector_warnings(os.environ if exporting else {}, log):
        try:
            for sock in proxy_socks:
                await web.SockSite(proxy_runner, sock, backlog=2048).start()
            metrics_url = ""
            for sock in metrics_socks:
                await web.SockSite(metrics_runner, sock).start()
            if metrics_socks:
                metrics_url = _bound_url(metrics_runner)
            metrics_addresses = tuple(str(address[0]) for address in metrics_runner.addresses)
            yield Running(_bound_url(proxy_runner), metrics_url, registry, state, metrics, live, metrics_addresses)
        finally:
            state.draining = True
            drained = await _drain(proxy_runner, state, settings.drain_seconds, stop_now)
            log.info("drain done: %s", drained.describe(settings.drain_seconds))
            await proxy_runner.cleanup()
            await metrics_runner.cleanup()
            wait = HURRIED_SHUTDOWN_SECONDS if stop_now is not None and stop_now.is_set() else TRACE_SHUTDOWN_SECONDS
            if genai is not None:
                await asyncio.to_thread(genai.stop, wait)  # what is queued gets recorded
            flushes = []  # both exports at once: exit stays within drain_seconds + ~2 s
            if own_meters and meters is not None:
                flushes.append(asyncio.to_thread(shutdown_meter_provider, meters, wait))
            if own_provider:
                flushes.append(asyncio.to_thread(shutdown_tracer_provider, provider, wait))
            await asyncio.gather(*flushes)


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT."""
    # The span exporter's thread and the /metrics render thread keep the GIL for up to the switch
    # interval (5 ms by default) before the event loop gets it back, and every stream waits with
    # it. At 1 ms, loop lag p99 under 100 streams/s with a healthy collector fell from 5-7 ms to 2-3.
    sys.setswitchinterval(LOOP_SWITCH_INTERVAL)
    shutdown = Shutdown().install()
    async with running(settings, stop_now=shutdown.now) as srv:
        # Everything built at start (modules, apps, pools) leaves the collector's reach, so a full
        # garbage collection walks only what requests create. With the OTLP collector down (spans
        # sit queued for seconds) a full collection paused the loop for 69 ms; frozen, 17 ms.
        gc.freeze()
        announce(settings, srv.proxy_url, srv.metrics_url, srv.metrics_addresses, ui=srv.live is not None)
        await shutdown.wait()
        log.info(
            "draining: up to %gs for %d requests in flight; a second Ctrl-C or SIGTERM cuts them now",
            settings.drain_seconds,
            len(srv.state.in_flight),
        )


def mirror_notice(settings: Settings, environ: Mapping[str, str]) -> str:
    """What `--mirror` costs and who gets the copies ("" when off). Raises ValueError for a
    mirror that cannot run as asked."""
    policy = mirror_policy(settings, environ)
    if policy is None:
        return ""
    if settings.workers > 1 or settings.telemetry_process:
        raise ValueError("--mirror runs in one serving process: drop --workers / --telemetry-process to use it")
    if settings.mirror_key_env and not environ.get(settings.mirror_key_env):
        raise ValueError(f"--mirror-key-env names {settings.mirror_key_env}, which is not set")
    route = next(r for r in routes_for(settings.upstream, settings.routes) if r.name == policy.route)
    return describe(policy, str(route.url.with_user(None)).rstrip("/"), settings.mirror_key_env)


def describe_routes(settings: Settings) -> str:
    """`/anthropic -> https://api.anthropic.com (anthropic), / -> ...`: where each prefix goes."""
    return ", ".join(
        f"{r.shown_prefix} -> {r.url.with_user(None).with_password(None)} ({r.name})"
        for r in routes_for(settings.upstream, settings.routes)
    )


def announce(
    settings: Settings,
    proxy_url: str,
    metrics_url: str,
    metrics_addresses: Sequence[str],
    *,
    ui: bool,
    processes: str = "",
) -> None:
    """The startup line (one process or a group's supervisor), after the live view's exposure warning."""
    token = settings.ui_token is not None
    if ui and not token and exposed(metrics_addresses):
        log.warning("%s", exposure_warning(metrics_url, capture_content=settings.capture_content))
    line = startup_line(
        proxy_url=proxy_url,
        upstream=str(without_credentials(upstream_url(settings.upstream))),  # userinfo holds a password
        metrics_url=metrics_url,
        ui=ui,
        ui_token=token,
        spans=span_destination(os.environ),
        processes=processes,
    )
    log.info("%s", line)
    if settings.routes:
        log.info("routes: %s", describe_routes(settings))


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run(settings: Settings) -> int:
    """The `taotrace serve` command."""
    configure_logging(settings.log_level)
    try:
        accounting_from(settings)  # a bad --prices file or --metric-label stops here, with its reason
        conflict = default_route_conflict("upstream" in settings.model_fields_set, settings.routes)
        if conflict is not None:
            raise ValueError(conflict)
        routes = routes_for(settings.upstream, settings.routes)
        forwards = [(r, forward_proxy_for(r.url, os.environ)) for r in routes]  # a bad HTTPS_PROXY, by name
        mirror = mirror_notice(settings, os.environ)
    except ValueError as exc:  # never the proxy's credentials: the messages are built without them
        log.error("%s", exc)
        return 2
    if mirror:
        log.warning("%s", mirror)
    for route, forward in forwards:
        if forward is not None:
            where = "the upstream" if len(routes) == 1 else f"upstream {route.name}"
            log.info("%s is reached through the %s", where, forward.where)
    try:
        if settings.workers > 1 or settings.telemetry_process:
            from proxy.workers.supervisor import serve_group  # only a group needs it

            run_loop(serve_group(settings))
        else:
            run_loop(serve(settings))
    except CannotListen as exc:  # one line naming the address and the flag to change
        log.error("%s", exc)
        return 2
    except OSError as exc:
        log.error("cannot serve: %s", exc)
        return 1
    return 0
