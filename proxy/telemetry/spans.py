"""OpenTelemetry: the tracer provider from `OTEL_*` variables, and the spans of one request.

A root span (`{operation} {model}`, kind CLIENT) is started when the request head has been
read, so its context can be injected upstream; the phase children `network`, `prefill_wait`
and `decode` are created when the request ends, from the frozen timing, with explicit times.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.baggage import get_all as get_all_baggage
from opentelemetry.context import Context
from opentelemetry.propagate import extract, get_global_textmap, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util import types

from proxy import __version__
from proxy.dialects import RequestInfo
from proxy.record import RequestRecord, Traced
from proxy.routes import Route
from proxy.telemetry import sdk_internals
from proxy.telemetry.otlp_env import export_settings, resource_attributes, traces_exporter
from proxy.telemetry.sampling import OutcomeSampling
from proxy.telemetry.semconv import Conventions
from proxy.telemetry.span_exporter import OtlpSpanExporter
from proxy.timing import RequestTiming, SpanContextValues, SpanStart

__all__ = ["Telemetry", "build_tracer_provider", "shutdown_tracer_provider"]

log = logging.getLogger("taotrace")


def _exporter_from_env(env: Mapping[str, str]) -> SpanExporter | None:
    """The exporter the standard variables ask for; None when nothing is configured."""
    kind = traces_exporter(env)
    if kind == "none":
        return None
    if kind == "console":
        return ConsoleSpanExporter()
    settings = export_settings(env, "traces")
    if settings is None:
        return None
    # Our own exporter: `otlp.py`'s bytes over HTTP/protobuf or gRPC, with the spec's retries.
    return OtlpSpanExporter(settings)


def build_tracer_provider(env: Mapping[str, str] | None = None, *, export: bool = True) -> TracerProvider:
    """A provider honouring the SDK's own variables (service name, sampler, BSP limits, OTLP).

    `export=False`: ids and sampling only, no exporter (a serving process whose spans the
    telemetry process builds and exports)."""
    env = os.environ if env is None else env
    resource = Resource.create(resource_attributes(env, __version__))
    provider = TracerProvider(resource=resource)
    exporter = _exporter_from_env(env) if export else None
    if exporter is not None:
        # The batch processor drops spans when its queue is full instead of blocking: requests first.
        limits: dict[str, Any] = {
            arg: int(env[var])
            for var, arg in (
                ("OTEL_BSP_MAX_QUEUE_SIZE", "max_queue_size"),
                ("OTEL_BSP_SCHEDULE_DELAY", "schedule_delay_millis"),
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "max_export_batch_size"),
                ("OTEL_BSP_EXPORT_TIMEOUT", "export_timeout_millis"),
            )
            if env.get(var, "").isdigit()
        }
        provider.add_span_processor(BatchSpanProcessor(exporter, **limits))
    return provider


def shutdown_tracer_provider(provider: object, timeout: float = 3.0) -> bool:
    """Flush and stop, but never wait more than `timeout` for a dead collector."""
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is None:
        return True
    worker = threading.Thread(target=shutdown, name="otel-shutdown", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        log.warning("trace export did not finish within %.1fs; unsent spans dropped", timeout)
        return False
    return True


def _redacted_query(query: str) -> str:
    """Keep the parameter names, never their values (`?key=` holds secrets)."""
    names = [part.split("=", 1)[0] for part in query.split("&") if part]
    return "&".join(f"{name}=REDACTED" for name in names)


def _tcp_attributes(attrs: dict[str, types.AnyValue], rec: RequestRecord) -> None:
    """The upstream connection's TCP_INFO for this request, and the server-wait estimate."""
    tcp = rec.tcp
    assert tcp is not None
    for key, value in (
        ("taotrace.tcp.rtt", tcp.rtt),
        ("taotrace.tcp.rtt_var", tcp.rtt_var),
        ("taotrace.tcp.min_rtt", tcp.min_rtt),
        ("taotrace.tcp.retransmits", tcp.retransmits),
        ("taotrace.tcp.out_of_order", tcp.out_of_order),
        ("taotrace.tcp.delivery_rate", tcp.delivery_rate),
        ("taotrace.server_wait", rec.server_wait),
    ):
        if value is not None:
            attrs[key] = value


def _context(ids: SpanContextValues) -> SpanContext:
    """A span context from the plain values a `SpanStart` carries."""
    trace_id, span_id, flags, remote, state = ids
    return SpanContext(trace_id, span_id, remote, TraceFlags(flags), TraceState(list(state)))


class Telemetry:
    """Starts and ends the spans of each request on a tracer from the given provider.

    With the SDK's tracer, its built-in samplers and processors that act on end only (the batch
    and simple processors), the spans are built directly (`proxy.telemetry.sdk_internals`): the
    root without a live SDK span, and the three phase children, known only when the request has
    ended, as finished `ReadableSpan`s, skipping a live span, its lock and attribute validation
    for each. Otherwise they go through the SDK's public `Tracer.start_span`.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider,
        *,
        upstream_host: str,
        upstream_port: int,
        upstream_base: str,
        capture_content: bool = False,
        sampling: OutcomeSampling | None = None,
        ship: bool = False,
        parent: str = "child",
        conventions: Conventions | None = None,
    ) -> None:
        """`parent`: what a caller's `traceparent` makes of the root (`--parent`): `child` joins the
        caller's trace; `link` starts a new trace whose root links to the caller's span; `none` a
        new trace without a link. With `link` and `none` the caller's trace headers go upstream as
        they came. `conventions`: the GenAI convention version (the tracer's schema URL)."""
        conventions = conventions or Conventions()
        self.tracer = tracer_provider.get_tracer("taotrace", __version__, schema_url=conventions.schema_url)
        self.parent = parent
        # Ship: this process only starts spans (ids, sampling, context upstream); each finished
        # request carries its root's start (`span_start`) to the telemetry process, which
        # finishes and exports it (`replay`). Spans are never built or encoded here.
        self.ship = ship
        self.server_address = upstream_host
        self.server_port = upstream_port
        self.upstream_base = upstream_base
        self.capture_content = capture_content
        self.sampling = sampling
        # perf_counter seconds -> epoch nanoseconds, fixed at start (spans need wall time).
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._textmap: object = None  # the global propagator last classified
        self._w3c = False
        tracer = self.tracer
        # Which spans may be built directly (see proxy.telemetry.sdk_internals): only on the SDK's tracer.
        self._sdk: SdkTracer | None = tracer if isinstance(tracer, SdkTracer) else None
        self._direct_ok, self._root_ok = sdk_internals.fast_paths(tracer)
        self._processors_seen: object = None
        self._sampler_seen: object = None
        self._follows = False  # the tracer's sampler samples the children of a sampled root
        self._direct = False  # children may be handed to the processors directly

    def _ns(self, t: float) -> int:
        return int(t * 1e9) + self._offset_ns

    def _w3c_textmap(self) -> bool:
        textmap = get_global_textmap()
        if textmap is not self._textmap:  # set_global_textmap() may replace it at any time
            self._w3c = sdk_internals.is_w3c_textmap(textmap)
            self._textmap = textmap
        return self._w3c

    def start(
        self,
        info: RequestInfo,
        method: str,
        path: str,
        query: str,
        carrier: Mapping[str, str],
        t0: float,
        route: Route | None = None,
        links: Sequence[SpanContext] = (),
    ) -> Span:
        """The root span, continuing the client's `traceparent` when it sent one.

        `route`: the upstream the request goes to (`server.*` name it, as the conventions ask of a
        proxy); default the one given at construction. `path` is the path as the upstream sees it.
        `links`: spans this one relates to (a mirror copy's, to the request it copies)."""
        if info.operation is None:
            name = method
        else:
            name = f"{info.operation} {info.model}" if info.model else info.operation
        if route is None:
            base, address, port = self.upstream_base, self.server_address, self.server_port
        else:
            base, address, port = route.base, route.host, route.port
        attributes: dict[str, types.AnyValue] = {
            "http.request.method": method,
            "url.path": path,
            "url.full": base + path + ("?" + _redacted_query(query) if query else ""),
            "server.address": address,
            "server.port": port,
            "taotrace.api": info.api,
        }
        if route is not None:
            attributes["taotrace.upstream"] = route.name
        if info.operation is not None:
            attributes["gen_ai.operation.name"] = info.operation
            attributes["gen_ai.provider.name"] = info.provider or "openai"
            attributes["gen_ai.request.stream"] = info.stream
            if info.model:
                attributes["gen_ai.request.model"] = info.model
            for key, value in info.params:
                attributes[key] = value
        if self.capture_content:  # shaped and bounded by the dialect (proxy/dialects/content.py)
            if info.system_instructions is not None:
                attributes["gen_ai.system_instructions"] = info.system_instructions
            if info.input_messages is not None:
                attributes["gen_ai.input.messages"] = info.input_messages
        # Most clients send no trace headers; the W3C propagators would then return an empty context.
        if self._w3c_textmap() and carrier.get("traceparent") is None and carrier.get("baggage") is None:
            context = sdk_internals.EMPTY_CONTEXT
        else:
            context = extract(carrier)
            if self.parent != "child":  # a trace of our own; `link`: the caller's span as a link
                caller = trace.get_current_span(context).get_span_context()
                if self.parent == "link" and caller.is_valid:
                    links = (*links, caller)
                context = sdk_internals.EMPTY_CONTEXT
        linked = tuple(Link(c) for c in links if c.is_valid) if links else ()
        sdk = self._sdk
        if self._root_ok and sdk is not None:
            self._processors()
            if self._direct and self._sampler_follows(sdk):
                return sdk_internals.direct_root(sdk, name, context, attributes, self._ns(t0), linked)
        return self.tracer.start_span(
            name,
            context=context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=self._ns(t0),
            links=linked or None,
        )

    def _sampler_follows(self, tracer: SdkTracer) -> bool:
        sampler = tracer.sampler
        if sampler is not self._sampler_seen:
            self._sampler_seen = sampler
            self._follows = sdk_internals.children_follow_root(sampler)
        return self._follows

    def inject(self, span: Span, headers: MutableMapping[str, str]) -> None:
        """Put our span's context in the upstream headers, replacing the client's `traceparent`
        (`--parent link` and `none`: the client's, when it sent one, goes upstream unchanged)."""
        if self.parent != "child" and "traceparent" in headers:
            return
        try:
            if self._w3c_textmap() and not get_all_baggage():
                # What TraceContextTextMapPropagator.inject writes; with no baggage in the current
                # context the baggage propagator writes nothing.
                ctx = span.get_span_context()
                if ctx == INVALID_SPAN_CONTEXT:
                    return
                headers["traceparent"] = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
                if ctx.trace_state:
                    headers["tracestate"] = ctx.trace_state.to_header()
            else:
                inject(headers, context=trace.set_span_in_context(span))
        except Exception:  # telemetry must never break a request
            log.exception("could not inject the trace context upstream")

    @staticmethod
    def trace_id(span: Span) -> str | None:
        ctx = span.get_span_context()
        return format(ctx.trace_id, "032x") if ctx.is_valid and ctx.trace_flags.sampled else None

    def _processors(self) -> tuple[object, ...] | None:
        """The provider's processors, or None when they cannot be inspected."""
        processors = sdk_internals.span_processors(self.tracer)
        if processors is not self._processors_seen:  # add_span_processor() replaces the tuple
            self._processors_seen = processors
            self._direct = (
                self._direct_ok and processors is not None and all(sdk_internals.end_only(p) for p in processors)
            )
        return processors

    def decide(self, span: Span, error_type: str, timing: RequestTiming) -> str:
        """Outcome sampling of a finished request: "" (no decision: the trace stays as it began),
        the reason it is kept, or "dropped"."""
        policy = self.sampling
        if policy is None or not policy.active or not span.is_recording():
            return ""
        ctx = span.get_span_context()
        if not ctx.trace_flags.sampled:
            return ""
        parent = getattr(span, "parent", None)  # the SDK's span and a directly built root both have it
        parent_sampled = parent is not None and parent.is_remote and parent.trace_flags.sampled
        return policy.reason(ctx.trace_id, parent_sampled, error_type, timing.ttft, timing.duration) or "dropped"

    def conclude(self, span: Span, error_type: str, timing: RequestTiming, output_text: str | None) -> Traced:
        """Everything a finished request's record needs from telemetry, asked once: its trace id
        (None when not traced or dropped), the outcome sampling decision, and in ship mode the
        root's start."""
        sampling = self.decide(span, error_type, timing)
        return Traced(
            trace_id=None if sampling == "dropped" else self.trace_id(span),
            sampling=sampling,
            span=self.span_start(span, sampling, output_text) if self.ship else None,
        )

    def finish(self, span: Span, rec: RequestRecord, output_text: str | None = None, offset: int | None = None) -> None:
        """Attributes from the record, the three phase children, then end the root span.

        `offset`: epoch ns minus monotonic ns of the process that timed the request (default: this one's)."""
        t = rec.timing
        offset = self._offset_ns if offset is None else offset
        end = int(t.end * 1e9) + offset
        if self.ship:  # the telemetry process finishes it from rec.span
            if type(span) is sdk_internals.Root:
                span.drop()
            else:
                span.end(end_time=end)  # no processor here: nothing is exported
            return
        if not span.is_recording():
            span.end(end_time=end)
            return
        if rec.sampling == "dropped":
            # Nothing is handed to the processors: the root is never ended (the end-only batch and
            # simple processors then never see it) and the phase children are never made.
            if type(span) is sdk_internals.Root:
                span.drop()
            return
        if self._processors() == () and self._direct:  # no exporter configured: nothing can leave
            span.end(end_time=end)
            return
        u = rec.usage
        attrs: dict[str, types.AnyValue] = {
            "http.response.status_code": rec.status_code,
            "taotrace.duration": t.duration,
        }
        for key, value in (
            ("gen_ai.response.model", rec.response_model),
            ("gen_ai.response.id", rec.response_id),
            ("gen_ai.usage.input_tokens", u.input_tokens),
            # Only what the provider reported: viewers price gen_ai.usage.*; our own count of a
            # stream's token events is taotrace.token_events.
            ("gen_ai.usage.output_tokens", u.output_tokens if rec.usage_source == "reported" else None),
            ("gen_ai.usage.cache_read.input_tokens", u.cached_input_tokens),
            ("gen_ai.usage.cache_creation.input_tokens", u.cache_creation_input_tokens),
            ("gen_ai.usage.reasoning.output_tokens", u.reasoning_tokens),
            ("gen_ai.response.time_to_first_chunk", t.ttfc),  # the spec's first chunk, not our first token
            ("taotrace.ttft", t.ttft),
            ("taotrace.ttfb", t.ttfb),
            ("taotrace.time_to_headers", t.time_to_headers),
            ("taotrace.tpot", t.tpot),
            ("taotrace.connection.reused", t.connection_reused),
        ):
            if value is not None:
                attrs[key] = value
        if rec.sampling:
            attrs["taotrace.sampling.reason"] = rec.sampling
        if rec.pair_id is not None:  # --mirror: the request and its copy
            attrs["taotrace.pair_id"] = rec.pair_id
            attrs["taotrace.mirror"] = rec.mirror
        if rec.finish_reasons:  # a tuple: what the SDK's BoundedAttributes would store for a list
            attrs["gen_ai.response.finish_reasons"] = tuple(rec.finish_reasons)
        if rec.tcp is not None:
            _tcp_attributes(attrs, rec)
        if rec.stream:
            attrs["taotrace.usage_source"] = rec.usage_source
            attrs["taotrace.token_events"] = t.token_events
        if rec.attributes:  # attribution: header values, user.id, taotrace.key.id (never the key)
            attrs.update(rec.attributes)
        if rec.rate_limits is not None:
            attrs.update(rec.rate_limits.attributes())
        if rec.cost is not None and rec.cost.amount is not None:
            attrs["taotrace.cost"] = rec.cost.amount
            attrs["taotrace.cost.currency"] = rec.cost.currency
        if output_text is not None and self.capture_content:  # JSON, bounded by the dialect's reader
            attrs["gen_ai.output.messages"] = output_text
        if rec.error_type:
            attrs["error.type"] = rec.error_type
            span.set_status(Status(StatusCode.ERROR, rec.error_type))
        if type(span) is sdk_internals.Root:
            span.attributes.update(attrs)
        else:
            span.set_attributes(attrs)
        phases = self._phases(rec, offset)
        sdk = self._sdk
        if self._direct and sdk is not None:
            follows = self._sampler_follows(sdk) and span.get_span_context().trace_flags.sampled
            sdk_internals.direct_children(sdk, span, phases, follows, lambda ctx, phase: self._child(ctx, *phase))
        else:
            ctx = trace.set_span_in_context(span)
            for phase in phases:
                self._child(ctx, *phase)
        span.end(end_time=end)

    def span_start(self, span: Span, sampling: str, output_text: str | None) -> SpanStart | None:
        """In ship mode, the root's start for the telemetry process; None when nothing is to be
        exported (not shipping, not sampled, or dropped by outcome sampling)."""
        if not self.ship or sampling == "dropped" or not span.is_recording():
            return None
        ctx = span.get_span_context()
        if not ctx.trace_flags.sampled:
            return None  # the worker's provider has no exporter; the telemetry process's would drop it
        parent = getattr(span, "parent", None)
        attributes = getattr(span, "attributes", None)
        links = tuple(
            (c.trace_id, c.span_id, int(c.trace_flags), c.is_remote, tuple(c.trace_state.items()))
            for c in (link.context for link in getattr(span, "links", None) or ())
        )
        return SpanStart(
            name=getattr(span, "name", ""),
            trace_id=ctx.trace_id,
            span_id=ctx.span_id,
            trace_flags=int(ctx.trace_flags),
            trace_state=tuple(ctx.trace_state.items()),
            parent=None
            if parent is None
            else (
                parent.trace_id,
                parent.span_id,
                int(parent.trace_flags),
                parent.is_remote,
                tuple(parent.trace_state.items()),
            ),  # fmt: skip
            start=int(getattr(span, "start_time", 0) or 0),
            attributes=dict(attributes) if attributes is not None else {},
            output=output_text if self.capture_content else None,
            offset=self._offset_ns,
            links=links,
        )

    def replay(self, rec: RequestRecord, resource: Resource | None = None) -> None:
        """The telemetry process's side of ship mode: the root as the serving process started it
        (same ids, start and attributes), then `finish` as one process would; `resource`: the
        serving process's own (its `service.instance.id`)."""
        seed, sdk = rec.span, self._sdk
        if seed is None or sdk is None or self._processors() == ():
            return  # nothing shipped, or no exporter here
        parent = None if seed.parent is None else _context(seed.parent)
        context = SpanContext(
            seed.trace_id, seed.span_id, False, TraceFlags(seed.trace_flags), TraceState(list(seed.trace_state))
        )
        links = tuple(Link(_context(link)) for link in seed.links)
        root = sdk_internals.Root(sdk, seed.name, context, parent, dict(seed.attributes), seed.start, links)  # type: ignore[arg-type]
        if resource is not None:
            root.resource = resource
        self.finish(root, rec, seed.output, seed.offset)

    def _phases(self, rec: RequestRecord, offset: int) -> list[sdk_internals.Phase]:
        """(name, start ns, end ns, attributes, error status) of each phase child."""
        t = rec.timing

        def ns(t: float) -> int:
            return int(t * 1e9) + offset

        net_attrs: dict[str, types.AnyValue] = {}
        if t.connection_reused is not None:
            net_attrs["taotrace.connection.reused"] = t.connection_reused
        if t.pool_wait is not None:
            net_attrs["taotrace.pool_wait"] = t.pool_wait
        if t.dns is not None:
            net_attrs["taotrace.dns"] = t.dns
        if t.connect is not None:
            net_attrs["taotrace.connect"] = t.connect
        status = Status(StatusCode.ERROR, rec.error_type) if rec.error_type and t.sent is None else None
        start = ns(t.start)
        phases = [("network", start, ns(t.sent) if t.sent is not None else ns(t.end), net_attrs, status)]
        if t.sent is not None and t.first_token is not None:
            sent, first = ns(t.sent), ns(t.first_token)
            phases.append(("prefill_wait", sent, first, {}, None))
            last = ns(t.last_token) if t.last_token is not None else first
            phases.append(("decode", first, last, {"taotrace.token_events": t.token_events}, None))
        return phases

    def _child(
        self, ctx: Context, name: str, start: int, end: int, attrs: dict[str, types.AnyValue], status: Status | None
    ) -> None:
        """A phase child through the SDK's general path."""
        child = self.tracer.start_span(name, context=ctx, kind=SpanKind.INTERNAL, start_time=start)
        if attrs:
            child.set_attributes(attrs)
        if status is not None:
            child.set_status(status)
        child.end(end_time=end)
