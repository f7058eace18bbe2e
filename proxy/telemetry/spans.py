"""OpenTelemetry spans of one request, built by the proxy itself and exported over OTLP.

A root span (`{operation} {model}`, kind CLIENT) is started when the request head has been
read, so its context can be injected upstream; the phase children `network`, `prefill_wait`
and `decode` are made when the request ends, from the frozen timing, with explicit times, and
handed with the root to the span processor as `SpanData` (see `spandata.py`, `tracing.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from functools import partial

from opentelemetry import trace
from opentelemetry.baggage import get_all as get_all_baggage
from opentelemetry.context import Context, get_current
from opentelemetry.propagate import extract, get_global_textmap, inject
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import AnyValue

from proxy import __version__
from proxy.config.routes import Route
from proxy.dialects import RequestInfo
from proxy.exchange.record import RequestRecord, SpanContextValues, SpanStart, Traced
from proxy.exchange.timing import RequestTiming
from proxy.telemetry import propagation
from proxy.telemetry.sampling import OutcomeSampling
from proxy.telemetry.semconv import Conventions
from proxy.telemetry.spandata import UNSET, Resource, Scope, SpanData, SpanProcessor
from proxy.telemetry.tracing import SpanLimits, Tracing

__all__ = ["NOT_TRACED", "RootSpan", "Spans", "bounded", "network_attributes"]

log = logging.getLogger("taotrace")

# (name, start ns, end ns, attributes, error status) of a phase child.

_RANDOM_TRACE_ID = 0x02  # W3C Trace Context level 2: the trace id's right 7 bytes are random
_SAMPLED = TraceFlags.SAMPLED
_EMPTY_STATE = TraceState()
_FLAGS = tuple(TraceFlags(flags) for flags in range(256))  # each byte's TraceFlags, made once
_CLIENT, _INTERNAL = SpanKind.CLIENT, SpanKind.INTERNAL


class RootSpan:
    """The request's root span while the request runs; the event loop's alone, so no lock.

    `recording` is False when the head sampler did not sample it (or it is `NOT_TRACED`): its
    context still goes upstream, but nothing is gathered or exported. `attributes` may be given
    as `make`, called the first time they are read (when the request ends): the sampler did not
    need them, so the request went upstream without waiting for them.
    """

    __slots__ = ("name", "context", "parent", "_attributes", "_make", "start_time", "links", "recording")

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, AnyValue] | None,
        start_time: int,
        links: tuple[Link, ...] = (),
        recording: bool = True,
        make: Callable[[], dict[str, AnyValue]] | None = None,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self._attributes = attributes
        self._make = make
        self.start_time = start_time
        self.links = links
        self.recording = recording

    @property
    def attributes(self) -> dict[str, AnyValue]:
        """The root's own attributes (a dict the end of the request adds to)."""
        attributes = self._attributes
        if attributes is None:
            make, self._make = self._make, None
            attributes = self._attributes = make() if make is not None else {}
        return attributes

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.recording


# A request whose span could not be started: no context upstream, nothing exported.
NOT_TRACED = RootSpan("", INVALID_SPAN_CONTEXT, None, {}, 0, recording=False)


def _redacted_query(query: str) -> str:
    """Keep the parameter names, never their values (`?key=` holds secrets)."""
    names = [part.split("=", 1)[0] for part in query.split("&") if part]
    return "&".join(f"{name}=REDACTED" for name in names)


def _tcp_attributes(attrs: dict[str, AnyValue], rec: RequestRecord) -> None:
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


def _cut(value: AnyValue, length: int) -> AnyValue:
    if isinstance(value, str):
        return value[:length]
    if isinstance(value, tuple | list):
        return tuple(v[:length] if isinstance(v, str) else v for v in value)
    return value


def bounded(attributes: dict[str, AnyValue], limits: SpanLimits) -> tuple[dict[str, AnyValue], int]:
    """`attributes` within `limits`, and how many were dropped. By default nothing bites (the
    proxy's spans carry far fewer than 128 attributes): then `attributes` itself, at once."""
    length = limits.length
    dropped = len(attributes) - limits.count
    if dropped <= 0 and length is None:
        return attributes, 0
    if dropped > 0:
        attributes = dict(list(attributes.items())[dropped:])  # the latest kept, as the SDK keeps them
    if length is not None:
        attributes = {key: _cut(value, length) for key, value in attributes.items()}
    return attributes, max(dropped, 0)


def _context(ids: SpanContextValues) -> SpanContext:
    """A span context from the plain values a `SpanStart` carries."""
    trace_id, span_id, flags, remote, state = ids
    return SpanContext(trace_id, span_id, remote, TraceFlags(flags), TraceState(list(state)))


def _values(context: SpanContext) -> SpanContextValues:
    return (
        context.trace_id,
        context.span_id,
        int(context.trace_flags),
        context.is_remote,
        tuple(context.trace_state.items()),
    )


class Spans:
    """Starts and ends the spans of each request, with the sampler, ids and processor of `tracing`."""

    def __init__(
        self,
        tracing: Tracing,
        *,
        upstream_host: str,
        upstream_port: int,
        upstream_base: str,
        capture_content: bool = False,
        capture_io_values: bool = False,
        sampling: OutcomeSampling | None = None,
        ship: bool = False,
        parent: str = "child",
        conventions: Conventions | None = None,
    ) -> None:
        """`parent`: what a caller's `traceparent` makes of the root (`--parent`): `child` joins the
        caller's trace; `link` starts a new trace whose root links to the caller's span; `none` a
        new trace without a link. With `link` and `none` the caller's trace headers go upstream as
        they came. `conventions`: the GenAI convention version (the scope's schema URL).
        `capture_io_values` (only with `capture_content`): OpenInference's `input.value` and
        `output.value` besides, the plain texts LLM trace viewers list traces by."""
        conventions = conventions or Conventions()
        self.tracing = tracing
        # The built-in samplers decide without the root's attributes: then they are made when the
        # request ends (`RootSpan.attributes`), not before its bytes go upstream.
        self._eager_attributes: bool = getattr(tracing.sampler, "reads_attributes", True)
        self.scope = Scope("taotrace", __version__, conventions.schema_url or None)
        self.parent = parent
        # Ship: this process only starts spans (ids, sampling, context upstream); each finished
        # request carries its root's start (`span_start`) to the telemetry process, which
        # finishes and exports it (`replay`). Spans are never built or encoded here.
        self.ship = ship
        self.server_address = upstream_host
        self.server_port = upstream_port
        self.upstream_base = upstream_base
        self.capture_content = capture_content
        self.capture_io_values = capture_io_values and capture_content
        self.sampling = sampling
        # perf_counter seconds -> epoch nanoseconds, fixed at start (spans need wall time).
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._textmap: object = None  # the global propagator last classified
        self._w3c = False
        # OTEL_SDK_DISABLED: no span at all, so nothing of the caller's trace context is touched.
        self._off = tracing.disabled

    @property
    def exporting(self) -> bool:
        """Whether finished spans go anywhere from this process."""
        return self.tracing.processor is not None

    @property
    def untraced(self) -> RootSpan:
        """The span of a request whose span could not be started: traced nowhere."""
        return NOT_TRACED

    def _ns(self, t: float) -> int:
        return int(t * 1e9) + self._offset_ns

    def _w3c_textmap(self) -> bool:
        textmap = get_global_textmap()
        if textmap is not self._textmap:  # set_global_textmap() may replace it at any time
            self._w3c = propagation.is_w3c(textmap)
            self._textmap = textmap
        return self._w3c

    def _caller(self, carrier: Mapping[str, str]) -> tuple[SpanContext | None, Context | None]:
        """The caller's span context, and the API context it came in when the configured
        propagators had to extract it (another format, or baggage a plug-in sampler may read)."""
        if self._w3c_textmap() and carrier.get("baggage") is None:
            return propagation.parse(carrier), None
        context = extract(carrier)
        caller = trace.get_current_span(context).get_span_context()
        return (caller if caller.is_valid else None), context

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
    ) -> RootSpan:
        """The root span, continuing the client's `traceparent` when it sent one.

        `route`: the upstream the request goes to (`server.*` name it, as the conventions ask of a
        proxy); default the one given at construction. `path` is the path as the upstream sees it.
        `links`: spans this one relates to (a mirror copy's, to the request it copies).
        `NOT_TRACED` when tracing is disabled (`OTEL_SDK_DISABLED`)."""
        if self._off:
            return NOT_TRACED
        if info.operation is None:
            name = method
        else:
            name = f"{info.operation} {info.model}" if info.model else info.operation
        # Most clients send no trace headers.
        parent, context = (None, None) if not carrier else self._caller(carrier)
        if parent is not None and self.parent != "child":  # a trace of our own; `link`: the caller's as a link
            if self.parent == "link":
                links = (*links, parent)
            parent, context = None, None
        linked = tuple(Link(c) for c in links if c.is_valid) if links else ()
        tracing = self.tracing
        ids = tracing.ids
        if parent is None:
            trace_id = ids.generate_trace_id()
            random_id = getattr(ids, "random_trace_id", False)
        else:
            trace_id = parent.trace_id
            random_id = bool(parent.trace_flags & _RANDOM_TRACE_ID)
        # A sampler that may read the attributes (a plug-in's) sees them, as the conventions ask.
        attributes = self._attributes(info, method, path, query, route) if self._eager_attributes else None
        result = tracing.sampler.should_sample(parent, trace_id, name, SpanKind.CLIENT, attributes, linked, context)
        flags = (_SAMPLED if result.sampled else 0) | (_RANDOM_TRACE_ID if random_id else 0)
        state = result.trace_state
        if state is None:
            state = _EMPTY_STATE if parent is None else parent.trace_state
        span_context = SpanContext(trace_id, ids.generate_span_id(), False, _FLAGS[flags], state)
        if attributes is None:
            make = partial(self._attributes, info, method, path, query, route, result.attributes)
            return RootSpan(name, span_context, parent, None, self._ns(t0), linked, result.sampled, make)
        if result.attributes:
            attributes.update(result.attributes)
        return RootSpan(name, span_context, parent, attributes, self._ns(t0), linked, result.sampled)

    def _attributes(
        self,
        info: RequestInfo,
        method: str,
        path: str,
        query: str,
        route: Route | None,
        sampler_attributes: Mapping[str, AnyValue] | None = None,
    ) -> dict[str, AnyValue]:
        """The root's attributes at its start (then the sampler's own, if it gave any)."""
        if route is None:
            base, address, port = self.upstream_base, self.server_address, self.server_port
        else:
            base, address, port = route.base, route.host, route.port
        attributes: dict[str, AnyValue] = {
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
            if info.input_value is not None and self.capture_io_values:  # OpenInference's, for list views
                attributes["input.value"] = info.input_value
                attributes["input.mime_type"] = "text/plain"
        if sampler_attributes:
            attributes.update(sampler_attributes)
        return attributes

    def inject(self, span: RootSpan, headers: MutableMapping[str, str]) -> None:
        """Put our span's context in the upstream headers, replacing the client's `traceparent`
        (`--parent link` and `none`: the client's, when it sent one, goes upstream unchanged)."""
        if self.parent != "child" and "traceparent" in headers:
            return
        try:
            ctx = span.context
            if not ctx.is_valid:
                return
            # An empty current context (a server's, always) has no baggage: not asked for it.
            if self._w3c_textmap() and not (get_current() and get_all_baggage()):
                # What the W3C propagators write. The baggage the client sent is in `headers`
                # already, forwarded as it came; baggage of the current context (an app embedding
                # the proxy) is the propagators' to add.
                headers["traceparent"] = propagation.format_traceparent(ctx)
                if ctx.trace_state:
                    headers["tracestate"] = ctx.trace_state.to_header()
                elif "tracestate" in headers:
                    # A client's state belongs to its own trace: not to one restarted here (its
                    # traceparent was invalid) nor to a span whose sampler set none (W3C §3.3).
                    del headers["tracestate"]
            else:
                inject(headers, context=trace.set_span_in_context(NonRecordingSpan(ctx)))
        except Exception:  # telemetry must never break a request
            log.exception("could not inject the trace context upstream")

    @staticmethod
    def trace_id(span: RootSpan) -> str | None:
        ctx = span.context
        return format(ctx.trace_id, "032x") if ctx.is_valid and ctx.trace_flags.sampled else None

    def decide(self, span: RootSpan, error_type: str, timing: RequestTiming) -> str:
        """Outcome sampling of a finished request: "" (no decision: the trace stays as it began),
        the reason it is kept, or "dropped"."""
        policy = self.sampling
        if policy is None or not policy.active or not span.recording:
            return ""
        ctx = span.context
        if not ctx.trace_flags.sampled:
            return ""
        parent = span.parent
        parent_sampled = parent is not None and parent.is_remote and parent.trace_flags.sampled
        return policy.reason(ctx.trace_id, parent_sampled, error_type, timing.ttft, timing.duration) or "dropped"

    def conclude(
        self,
        span: RootSpan,
        error_type: str,
        timing: RequestTiming,
        output_text: str | None,
        output_value: str | None = None,
    ) -> Traced:
        """Everything a finished request's record needs from telemetry, asked once: its trace id
        (None when not traced or dropped), the outcome sampling decision, and the root's start for
        the span observer (`end`), here or, shipped, in a group's supervisor."""
        sampling = self.decide(span, error_type, timing)
        return Traced(
            trace_id=None if sampling == "dropped" else self.trace_id(span),
            sampling=sampling,
            span=self.span_start(span, sampling, output_text, output_value),
        )

    def _end(
        self,
        processor: SpanProcessor,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        start_time: int,
        links: tuple[Link, ...],
        attrs: dict[str, AnyValue],
        rec: RequestRecord,
        output_text: str | None,
        output_value: str | None,
        offset: int,
        resource: Resource,
    ) -> None:
        """The root's attributes from the record (into `attrs`, the root's own dict), its phase
        children and the root itself, to `processor`."""
        t = rec.timing
        status = UNSET
        u = rec.usage
        # Written straight into the root's attributes, in the order they are documented (no
        # second dict merged in, no tuple of pairs built per request): the same keys in the
        # same order as an update() would leave them.
        attrs["http.response.status_code"] = rec.status_code
        attrs["taotrace.duration"] = t.duration
        if rec.response_model is not None:
            attrs["gen_ai.response.model"] = rec.response_model
        if rec.response_id is not None:
            attrs["gen_ai.response.id"] = rec.response_id
        if u.input_tokens is not None:
            attrs["gen_ai.usage.input_tokens"] = u.input_tokens
        # Only what the provider reported: viewers price gen_ai.usage.*; our own count of a
        # stream's token events is taotrace.token_events.
        if u.output_tokens is not None and rec.usage_source == "reported":
            attrs["gen_ai.usage.output_tokens"] = u.output_tokens
        if u.cached_input_tokens is not None:
            attrs["gen_ai.usage.cache_read.input_tokens"] = u.cached_input_tokens
        if u.cache_creation_input_tokens is not None:
            attrs["gen_ai.usage.cache_creation.input_tokens"] = u.cache_creation_input_tokens
        if u.reasoning_tokens is not None:
            attrs["gen_ai.usage.reasoning.output_tokens"] = u.reasoning_tokens
        if t.ttfc is not None:  # the spec's first chunk, not our first token
            attrs["gen_ai.response.time_to_first_chunk"] = t.ttfc
        if t.ttft is not None:
            attrs["taotrace.ttft"] = t.ttft
        if t.ttfb is not None:
            attrs["taotrace.ttfb"] = t.ttfb
        if t.time_to_headers is not None:
            attrs["taotrace.time_to_headers"] = t.time_to_headers
        if t.tpot is not None:
            attrs["taotrace.tpot"] = t.tpot
        if t.connection_reused is not None:
            attrs["taotrace.connection.reused"] = t.connection_reused
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
        if output_value is not None and self.capture_io_values:  # plain text, bounded likewise
            attrs["output.value"] = output_value
            attrs["output.mime_type"] = "text/plain"
        if rec.error_type:
            attrs["error.type"] = rec.error_type
            status = Status(StatusCode.ERROR, rec.error_type)
        tracing = self.tracing
        self._children(processor, context, rec, offset, resource)
        attributes, dropped = bounded(attrs, tracing.limits)  # within limits: the root's dict itself
        processor.on_end(
            SpanData(
                name, context, parent, _CLIENT, start_time, int(t.end * 1e9) + offset, attributes, resource,
                self.scope, status, links, (), dropped,
            )
        )  # fmt: skip

    def _children(
        self, processor: SpanProcessor, parent: SpanContext, rec: RequestRecord, offset: int, resource: Resource
    ) -> None:
        """The phase children, straight from the timing: `network`, then `prefill_wait` and
        `decode` once a first token came."""
        t = rec.timing
        sent = t.sent
        start = int(t.start * 1e9) + offset
        end = int((t.end if sent is None else sent) * 1e9) + offset
        status = Status(StatusCode.ERROR, rec.error_type) if rec.error_type and sent is None else UNSET
        self._child(processor, parent, "network", start, end, network_attributes(t), status, resource)
        if sent is None or t.first_token is None:
            return
        first = int(t.first_token * 1e9) + offset
        last = int(t.last_token * 1e9) + offset if t.last_token is not None else first
        self._child(processor, parent, "prefill_wait", end, first, {}, UNSET, resource)
        self._child(
            processor, parent, "decode", first, last, {"taotrace.token_events": t.token_events}, UNSET, resource
        )

    def _child(
        self,
        processor: SpanProcessor,
        parent: SpanContext,
        name: str,
        start: int,
        end: int,
        attrs: dict[str, AnyValue],
        status: Status,
        resource: Resource,
    ) -> None:
        """One phase child of a sampled root. A sampler that `follows` (the built-in ones) samples
        it with the root's trace state; another is asked, as for any child span."""
        tracing = self.tracing
        sampler, new_span_id = tracing.sampler, tracing.ids.generate_span_id
        state = parent.trace_state
        if not sampler.follows:
            result = sampler.should_sample(parent, parent.trace_id, name, SpanKind.INTERNAL, None, (), None)
            if not result.sampled:
                new_span_id()  # an unsampled span has an id too: the same ids as the SDK draws
                return
            if result.trace_state is not None:
                state = result.trace_state
            if result.attributes:
                attrs = {**attrs, **result.attributes}
        flags = _FLAGS[_SAMPLED | (parent.trace_flags & _RANDOM_TRACE_ID)]
        attrs, dropped = bounded(attrs, tracing.limits)
        processor.on_end(
            SpanData(
                name, SpanContext(parent.trace_id, new_span_id(), False, flags, state), parent, _INTERNAL, start, end,
                attrs, resource, self.scope, status, (), (), dropped,
            )
        )  # fmt: skip

    def span_start(
        self, span: RootSpan, sampling: str, output_text: str | None, output_value: str | None = None
    ) -> SpanStart | None:
        """The root's start, for the span observer; None when nothing is to be exported (no
        exporter here nor a process to ship to, not sampled, or dropped by outcome sampling)."""
        if sampling == "dropped" or not span.recording or not (self.ship or self.tracing.processor is not None):
            return None
        ctx = span.context
        if not ctx.trace_flags.sampled:
            return None
        return SpanStart(
            name=span.name,
            trace_id=ctx.trace_id,
            span_id=ctx.span_id,
            trace_flags=int(ctx.trace_flags),
            trace_state=tuple(ctx.trace_state.items()),
            parent=None if span.parent is None else _values(span.parent),
            start=span.start_time,
            attributes=span.attributes,  # the root's own dict: the request is over, nothing else writes it
            output=output_text if self.capture_content else None,
            output_value=output_value if self.capture_io_values else None,
            offset=self._offset_ns,
            links=tuple(_values(link.context) for link in span.links),
        )

    def end(self, rec: RequestRecord, resource: Resource | None = None) -> None:
        """The span observer: the root as it was started (same ids, start and attributes, from
        `rec.span`), its attributes from the record, its phase children, to the processor.
        `resource`: the process that served it (default this one's; a group's supervisor passes
        the worker's, with its `service.instance.id`)."""
        seed = rec.span
        processor = self.tracing.processor
        if seed is None or processor is None or rec.sampling == "dropped":
            return  # nothing shipped, no exporter here, or nothing to make
        # The root's context straight from the plain values (no RootSpan between them); most
        # roots carry no trace state: the shared empty one, not a new one each.
        state = TraceState(list(seed.trace_state)) if seed.trace_state else _EMPTY_STATE
        context = SpanContext(seed.trace_id, seed.span_id, False, _FLAGS[seed.trace_flags & 0xFF], state)
        parent = None if seed.parent is None else _context(seed.parent)
        links = tuple(Link(_context(link)) for link in seed.links) if seed.links else ()
        attributes: dict[str, AnyValue] = seed.attributes  # the span's own now
        self._end(
            processor, seed.name, context, parent, seed.start, links, attributes, rec, seed.output,
            seed.output_value, seed.offset, resource or self.tracing.resource,
        )  # fmt: skip


def network_attributes(t: RequestTiming) -> dict[str, AnyValue]:
    """The `network` span's connection steps, each only when it was measured."""
    attrs: dict[str, AnyValue] = {}
    if t.connection_reused is not None:
        attrs["taotrace.connection.reused"] = t.connection_reused
    if t.pool_wait is not None:
        attrs["taotrace.pool_wait"] = t.pool_wait
    if t.dns is not None:
        attrs["taotrace.dns"] = t.dns
    if t.connect is not None:
        attrs["taotrace.connect"] = t.connect
    return attrs
