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
from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import trace
from opentelemetry.baggage import get_all as get_all_baggage
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagate import extract, get_global_textmap, inject
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util import types

from proxy import __version__
from proxy.dialects import RequestInfo
from proxy.telemetry import otlp
from proxy.telemetry.sampling import OutcomeSampling
from proxy.timing import RequestRecord, RequestTiming

__all__ = ["Telemetry", "build_tracer_provider", "shutdown_tracer_provider"]

log = logging.getLogger("taotrace")


def _exporter_from_env(env: Mapping[str, str]) -> SpanExporter | None:
    """The exporter the standard variables ask for; None when nothing is configured."""
    kind = env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower()
    if kind == "none":
        return None
    if kind == "console":
        return ConsoleSpanExporter()
    traces_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not (traces_endpoint or endpoint):
        return None  # no endpoint: no network export is attempted
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    ).lower()
    # The endpoint is passed explicitly so a mapping given here wins; headers, timeout,
    # compression and certificates are read by the exporter from the process environment.
    # The library's exporters, encoding with proxy.telemetry.otlp (the same bytes, ~5x less CPU per span).
    if protocol == "grpc":
        return otlp.grpc_exporter(traces_endpoint or endpoint or "")
    # Per the spec, the generic endpoint gets the signal path appended; the traces one is used as is.
    return otlp.http_exporter(traces_endpoint or f"{(endpoint or '').rstrip('/')}/v1/traces")


def build_tracer_provider(env: Mapping[str, str] | None = None) -> TracerProvider:
    """A provider honouring the SDK's own variables (service name, sampler, BSP limits, OTLP)."""
    env = os.environ if env is None else env
    resource = Resource.create(
        {"service.name": env.get("OTEL_SERVICE_NAME", "taotrace"), "service.version": __version__}
    )
    provider = TracerProvider(resource=resource)
    exporter = _exporter_from_env(env)
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


# The fast paths below are taken only where they produce exactly what the SDK's general path
# would; anything they do not recognise (another propagator, a processor with an on_start hook,
# the SDK's own span metrics, tiny attribute limits) gets the general path.
_EMPTY_CONTEXT = Context()  # what extract() returns for a carrier without W3C headers
_W3C_PROPAGATORS = {TraceContextTextMapPropagator, W3CBaggagePropagator}
# Processors whose on_start/_on_ending do nothing: they only need on_end, which takes a ReadableSpan.
_NOOP_ON_START = {SpanProcessor.on_start, SimpleSpanProcessor.on_start, BatchSpanProcessor.on_start}
_NOOP_ON_ENDING = {getattr(cls, "_on_ending", None) for cls in (SpanProcessor, SimpleSpanProcessor, BatchSpanProcessor)}
_RANDOM_TRACE_ID = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)  # W3C level 2 flag (newer SDKs)
_MAX_CHILD_ATTRIBUTES = 4  # `network` has the most
# The root has at most 75: 42 of its own (20 at start with 9 request parameters, 22 at the end)
# and 33 from proxy/accounting: at most 16 header attributes + user.id + taotrace.key.id,
# 13 rate-limit values, taotrace.cost and its currency.
_MAX_ROOT_ATTRIBUTES = 80
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


def _is_w3c_textmap(propagator: object) -> bool:
    """True for `tracecontext` or `tracecontext,baggage` (the default): headers we can read and write directly."""
    if type(propagator) is CompositePropagator:
        parts = getattr(propagator, "_propagators", None)
    else:
        parts = (propagator,)
    if not parts:
        return False
    kinds = {type(p) for p in parts}
    return TraceContextTextMapPropagator in kinds and kinds <= _W3C_PROPAGATORS


def _end_only(processor: object) -> bool:
    cls = type(processor)
    return getattr(cls, "on_start", None) in _NOOP_ON_START and getattr(cls, "_on_ending", None) in _NOOP_ON_ENDING


# Samplers that sample every child of a sampled local parent, with the parent's trace state and no
# attributes of their own: ALWAYS_ON, the ParentBased ones with their default delegates, and
# trace-id ratio (a child has its parent's trace id). What OTEL_TRACES_SAMPLER builds is among them.
_FOLLOWING_SAMPLERS = (sampling.ALWAYS_ON, sampling.DEFAULT_ON, sampling.DEFAULT_OFF)
_FOLLOWING_SAMPLER_TYPES = {
    cls
    for cls in (
        sampling.TraceIdRatioBased,
        sampling.ParentBasedTraceIdRatio,
        *(getattr(sampling, name, None) for name in ("_AlwaysOn", "_ParentBasedAlwaysOn", "_ParentBasedAlwaysOff")),
    )
    if cls is not None
}


def _children_follow_root(sampler: object) -> bool:
    return any(sampler is s for s in _FOLLOWING_SAMPLERS) or type(sampler) in _FOLLOWING_SAMPLER_TYPES


def _sdk_internal_metrics_enabled() -> bool:
    return os.environ.get("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "").strip().lower() == "true"


class _Root(Span):
    """The request's root span when Telemetry builds it directly (see Telemetry._direct_root).

    Holds what Tracer.start_span's `_Span` would hold, as a plain dict of attributes (Telemetry
    only sets valid values; lists become tuples as BoundedAttributes makes them), and on `end`
    hands the processors the same `ReadableSpan` the SDK would. It lives on the event loop only,
    so it needs no lock. Telemetry never adds events or links to the root: `add_event`,
    `add_link` and `record_exception` are accepted and ignored.
    """

    __slots__ = (
        "_tracer",
        "_name",
        "_context",
        "_parent",
        "_attributes",
        "_start",
        "_status",
        "_ended",
        "_resource",
        "_scope",
    )

    def __init__(
        self,
        tracer: SdkTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, types.AnyValue],
        start: int,
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._context = context
        self._parent = parent
        self._attributes = attributes
        self._start = start
        self._status = _UNSET
        self._ended = False
        self._resource = tracer.resource  # what the SDK span takes at start
        self._scope = tracer._instrumentation_scope

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return not self._ended

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        if self._ended:
            return
        mine = self._attributes
        for key, value in attributes.items():
            mine.pop(key, None)  # a key set again moves to the end, as in BoundedAttributes
            mine[key] = tuple(value) if isinstance(value, list) else value

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        self.set_attributes({key: value})

    def update_name(self, name: str) -> None:
        if not self._ended:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # Tracer's _Span.set_status: OK is final, UNSET is ignored.
        if self._ended or self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is not StatusCode.UNSET:
                self._status = status
        elif status is not StatusCode.UNSET:
            self._status = Status(status, description)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        pass  # never used by Telemetry (see the class docstring)

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        pass

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        pass

    def end(self, end_time: int | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        tracer = self._tracer
        tracer.span_processor.on_end(
            ReadableSpan(
                self._name,
                context=self._context,
                parent=self._parent,
                resource=self._resource,
                attributes=self._attributes,
                kind=SpanKind.CLIENT,
                instrumentation_info=tracer.instrumentation_info,
                status=self._status,
                start_time=self._start,
                end_time=end_time if end_time is not None else time.time_ns(),
                instrumentation_scope=self._scope,
            )
        )


_UNSET = Status(StatusCode.UNSET)


class Telemetry:
    """Starts and ends the spans of each request on a tracer from the given provider.

    The root span is an ordinary SDK span. The three phase children are known only when the
    request has ended, so (with the SDK's tracer and processors that act on end only, i.e. the
    batch and simple processors) they are handed to the processors as finished `ReadableSpan`s,
    skipping a live span, its lock and attribute validation for each.
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
    ) -> None:
        self.tracer = tracer_provider.get_tracer("taotrace", __version__)
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
        limits = getattr(tracer, "_span_limits", None)
        max_attrs = getattr(limits, "max_span_attributes", 0)
        self._direct_ok = (
            isinstance(tracer, SdkTracer)
            and all(hasattr(tracer, a) for a in ("sampler", "id_generator", "span_processor"))
            and (max_attrs is None or max_attrs >= _MAX_CHILD_ATTRIBUTES)
            and not _sdk_internal_metrics_enabled()  # the SDK would count each child span
        )
        # The root too, when its attributes need no bounding (no count or length limit can bite)
        # and the SDK pieces it copies are where this version keeps them.
        self._root_ok = (
            self._direct_ok
            and (max_attrs is None or max_attrs >= _MAX_ROOT_ATTRIBUTES)
            and getattr(limits, "max_span_attribute_length", 0) is None
            and all(hasattr(tracer, a) for a in ("resource", "instrumentation_info", "_instrumentation_scope"))
            and hasattr(getattr(tracer, "id_generator", None), "is_trace_id_random")
            and hasattr(TraceFlags, "random_trace_id")
        )
        self._processors_seen: object = None
        self._sampler_seen: object = None
        self._follows = False  # the tracer's sampler samples the children of a sampled root
        self._direct = False  # children may be handed to the processors directly

    def _ns(self, t: float) -> int:
        return int(t * 1e9) + self._offset_ns

    def _w3c_textmap(self) -> bool:
        textmap = get_global_textmap()
        if textmap is not self._textmap:  # set_global_textmap() may replace it at any time
            self._w3c = _is_w3c_textmap(textmap)
            self._textmap = textmap
        return self._w3c

    def start(
        self, info: RequestInfo, method: str, path: str, query: str, carrier: Mapping[str, str], t0: float
    ) -> Span:
        """The root span, continuing the client's `traceparent` when it sent one."""
        if info.operation is None:
            name = method
        else:
            name = f"{info.operation} {info.model}" if info.model else info.operation
        attributes: dict[str, types.AnyValue] = {
            "http.request.method": method,
            "url.path": path,
            "url.full": self.upstream_base + path + ("?" + _redacted_query(query) if query else ""),
            "server.address": self.server_address,
            "server.port": self.server_port,
            "taotrace.api": info.api,
        }
        if info.operation is not None:
            attributes["gen_ai.operation.name"] = info.operation
            attributes["gen_ai.provider.name"] = info.provider or "openai"
            attributes["gen_ai.request.stream"] = info.stream
            if info.model:
                attributes["gen_ai.request.model"] = info.model
            for key, value in info.params:
                attributes[key] = value
        if self.capture_content and info.content is not None:
            attributes["gen_ai.input.messages"] = info.content[:65536]
        # Most clients send no trace headers; the W3C propagators would then return an empty context.
        if self._w3c_textmap() and carrier.get("traceparent") is None and carrier.get("baggage") is None:
            context = _EMPTY_CONTEXT
        else:
            context = extract(carrier)
        if self._root_ok:
            self._processors()
            if self._direct and self._sampler_follows():
                return self._direct_root(name, context, attributes, self._ns(t0))
        return self.tracer.start_span(
            name, context=context, kind=SpanKind.CLIENT, attributes=attributes, start_time=self._ns(t0)
        )

    def _sampler_follows(self) -> bool:
        sampler = self.tracer.sampler  # type: ignore[attr-defined]
        if sampler is not self._sampler_seen:
            self._sampler_seen = sampler
            self._follows = _children_follow_root(sampler)
        return self._follows

    def _direct_root(self, name: str, context: Context, attributes: dict[str, types.AnyValue], start: int) -> Span:
        """Tracer.start_span's steps, in its order (ids, sampler), without a live SDK span.

        Only for the built-in samplers (whose result carries exactly the attributes given) and
        end-only processors (nothing to call at start).
        """
        tracer: SdkTracer = self.tracer  # type: ignore[assignment]
        enabled = getattr(tracer, "_is_enabled", None)  # a tracer configurator may disable it
        if enabled is not None and not enabled():
            return tracer.start_span(
                name, context=context, kind=SpanKind.CLIENT, attributes=attributes, start_time=start
            )
        ids = tracer.id_generator
        parent: SpanContext | None = trace.get_current_span(context).get_span_context()
        if parent is None or not parent.is_valid:
            parent = None
            trace_id = ids.generate_trace_id()
            random_trace_id = ids.is_trace_id_random()
        else:
            trace_id = parent.trace_id
            random_trace_id = parent.trace_flags.random_trace_id
        result = tracer.sampler.should_sample(context, trace_id, name, SpanKind.CLIENT, attributes, ())
        flags = _SAMPLED if result.decision is Decision.RECORD_AND_SAMPLE else _NOT_SAMPLED
        if random_trace_id:
            flags = TraceFlags(flags | _RANDOM_TRACE_ID)
        span_context = SpanContext(trace_id, ids.generate_span_id(), False, flags, result.trace_state)
        if result.decision is Decision.DROP:
            return NonRecordingSpan(span_context)
        return _Root(tracer, name, span_context, parent, attributes, start)

    def inject(self, span: Span, headers: MutableMapping[str, str]) -> None:
        """Put our span's context in the upstream headers, replacing the client's `traceparent`."""
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
        processors = getattr(getattr(self.tracer, "span_processor", None), "_span_processors", None)
        if processors is not self._processors_seen:  # add_span_processor() replaces the tuple
            self._processors_seen = processors
            self._direct = self._direct_ok and processors is not None and all(_end_only(p) for p in processors)
        return processors if isinstance(processors, tuple) else None

    def decide(self, span: Span, error_type: str, timing: RequestTiming) -> str:
        """Outcome sampling of a finished request: "" (no decision: the trace stays as it began),
        the reason it is kept, or "dropped"."""
        policy = self.sampling
        if policy is None or not policy.active or not span.is_recording():
            return ""
        ctx = span.get_span_context()
        if not ctx.trace_flags.sampled:
            return ""
        parent = span._parent if type(span) is _Root else getattr(span, "parent", None)
        parent_sampled = parent is not None and parent.is_remote and parent.trace_flags.sampled
        return policy.reason(ctx.trace_id, parent_sampled, error_type, timing.ttft, timing.duration) or "dropped"

    def finish(self, span: Span, rec: RequestRecord, output_text: str | None = None) -> None:
        """Attributes from the record, the three phase children, then end the root span."""
        t = rec.timing
        if not span.is_recording():
            span.end(end_time=self._ns(t.end))
            return
        if rec.sampling == "dropped":
            # Nothing is handed to the processors: the root is never ended (the end-only batch and
            # simple processors then never see it) and the phase children are never made.
            if type(span) is _Root:
                span._ended = True
            return
        if self._processors() == () and self._direct:  # no exporter configured: nothing can leave
            span.end(end_time=self._ns(t.end))
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
            ("gen_ai.usage.output_tokens", u.output_tokens),
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
        if rec.finish_reasons:  # a tuple: what the SDK's BoundedAttributes would store for a list
            attrs["gen_ai.response.finish_reasons"] = tuple(rec.finish_reasons)
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
        if output_text is not None and self.capture_content:
            attrs["gen_ai.output.messages"] = output_text[:65536]
        if rec.error_type:
            attrs["error.type"] = rec.error_type
            span.set_status(Status(StatusCode.ERROR, rec.error_type))
        if type(span) is _Root:
            span._attributes.update(attrs)
        else:
            span.set_attributes(attrs)
        phases = self._phases(rec)
        if self._direct:
            self._direct_children(span, phases)
        else:
            ctx = trace.set_span_in_context(span)
            for phase in phases:
                self._child(ctx, *phase)
        span.end(end_time=self._ns(t.end))

    def _phases(self, rec: RequestRecord) -> list[tuple[str, int, int, dict[str, types.AnyValue], Status | None]]:
        """(name, start ns, end ns, attributes, error status) of each phase child."""
        t = rec.timing
        ns = self._ns
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

    def _direct_children(
        self, root: Span, phases: list[tuple[str, int, int, dict[str, types.AnyValue], Status | None]]
    ) -> None:
        """The phase children as finished spans, exactly as Tracer.start_span + end would make them."""
        tracer: SdkTracer = self.tracer  # type: ignore[assignment]
        parent = root.get_span_context()
        trace_id = parent.trace_id
        sampler = tracer.sampler
        follows = self._sampler_follows() and parent.trace_flags.sampled
        ctx = trace.set_span_in_context(root) if not follows else _EMPTY_CONTEXT
        new_span_id = tracer.id_generator.generate_span_id
        on_end = tracer.span_processor.on_end
        if type(root) is _Root:
            resource, scope = root._resource, root._scope
        else:
            resource = root.resource  # type: ignore[attr-defined]
            scope = root.instrumentation_scope  # type: ignore[attr-defined]
        info = tracer.instrumentation_info
        # A sampled child of a local parent: SAMPLED, plus the parent's random-trace-id flag.
        flags = TraceFlags(TraceFlags.SAMPLED | (parent.trace_flags & _RANDOM_TRACE_ID))
        trace_state: TraceState | None = parent.trace_state
        for name, start, end, attrs, status in phases:
            if not follows:  # ask the sampler, as Tracer.start_span would
                result = sampler.should_sample(ctx, trace_id, name, SpanKind.INTERNAL, None, ())
                if result.attributes:  # a custom sampler's attributes: let the SDK merge and bound them
                    self._child(ctx, name, start, end, attrs, status)
                    continue
                if result.decision is not Decision.RECORD_AND_SAMPLE:
                    new_span_id()  # the SDK gives an unsampled span an id too
                    continue  # dropped, or recorded only: end-only processors export neither
                trace_state = result.trace_state
            span = ReadableSpan(
                name,
                context=SpanContext(trace_id, new_span_id(), False, flags, trace_state),
                parent=parent,
                resource=resource,
                attributes=attrs,
                kind=SpanKind.INTERNAL,
                instrumentation_info=info,
                start_time=start,
                end_time=end,
                instrumentation_scope=scope,
                status=_UNSET if status is None else status,
            )
            on_end(span)
