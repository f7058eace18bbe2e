"""OpenTelemetry spans of one request, built by the proxy itself and exported over OTLP.

A root span (`{operation} {model}`, kind CLIENT) is started when the request head has been
read, so its context can be injected upstream, and concluded once when the request ends (its
trace id, the outcome sampling decision, and its start for the record). The span observer
`end` builds the root and its phase children from the record (`span_end.py`).
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
from opentelemetry.trace import INVALID_SPAN_CONTEXT, Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.util.types import AnyValue

from proxy import __version__
from proxy.config.routes import Route
from proxy.dialects import RequestInfo
from proxy.exchange.record import RequestRecord, SpanStart, Traced
from proxy.exchange.timing import RequestTiming
from proxy.telemetry import propagation
from proxy.telemetry.sampling import OutcomeSampling
from proxy.telemetry.semconv import Conventions
from proxy.telemetry.span_end import EMPTY_STATE, FLAGS, RANDOM_TRACE_ID, SpanEnd
from proxy.telemetry.spandata import Scope
from proxy.telemetry.tracing import Tracing

__all__ = ["NOT_TRACED", "RootSpan", "Spans"]

log = logging.getLogger("taotrace")

_SAMPLED = TraceFlags.SAMPLED


class RootSpan:
    """The request's root span while the request runs; the event loop's alone, so no lock.

    `recording` is False when the head sampler did not sample it (or it is `NOT_TRACED`): its
    context still goes upstream, but nothing is gathered or exported. `attributes` may be given
    as `make`, called the first time they are read (when the request ends): the sampler did not
    need them, so the request went upstream without waiting for them.
    """

    __slots__ = (
        "name", "context", "parent", "_attributes", "_make", "start_time", "links", "recording", "output",
        "output_value",
    )  # fmt: skip

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
        self.output: str | None = None  # the output texts, with content capture, once the request ended
        self.output_value: str | None = None

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
        self.server_address = upstream_host
        self.server_port = upstream_port
        self.upstream_base = upstream_base
        self.capture_content = capture_content
        self.capture_io_values = capture_io_values and capture_content
        self.sampling = sampling
        self._span_end = SpanEnd(tracing, self.scope, capture_content, self.capture_io_values)
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
            random_id = bool(parent.trace_flags & RANDOM_TRACE_ID)
        # A sampler that may read the attributes (a plug-in's) sees them, as the conventions ask.
        attributes = self._attributes(info, method, path, query, route) if self._eager_attributes else None
        result = tracing.sampler.should_sample(parent, trace_id, name, SpanKind.CLIENT, attributes, linked, context)
        flags = (_SAMPLED if result.sampled else 0) | (RANDOM_TRACE_ID if random_id else 0)
        state = result.trace_state
        if state is None:
            state = EMPTY_STATE if parent is None else parent.trace_state
        span_context = SpanContext(trace_id, ids.generate_span_id(), False, FLAGS[flags], state)
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
        the span observer (`end`)."""
        sampling = self.decide(span, error_type, timing)
        return Traced(
            trace_id=None if sampling == "dropped" else self.trace_id(span),
            sampling=sampling,
            span=self.span_start(span, sampling, output_text, output_value),
        )

    def span_start(
        self, span: RootSpan, sampling: str, output_text: str | None, output_value: str | None = None
    ) -> SpanStart | None:
        """The root's start, for the span observer; None when nothing is to be exported (no
        exporter, not sampled, or dropped by outcome sampling)."""
        if sampling == "dropped" or not span.recording or self.tracing.processor is None:
            return None
        if not span.context.trace_flags.sampled:
            return None
        if self.capture_content:  # the request is over: nothing else writes the span now
            span.output = output_text
            span.output_value = output_value if self.capture_io_values else None
        return span

    def end(self, rec: RequestRecord) -> None:
        """The span observer: the root and its phase children from `rec` (see `SpanEnd.end`)."""
        self._span_end.end(rec, self._offset_ns)
