"""Every use of the OpenTelemetry SDK's and exporters' private internals, in one place.

The fast paths of `spans.py` (spans built without a live SDK span) rely on how
this SDK version is put together (the span exporter is our own: `span_exporter.py`). Each is
taken only when the pieces it needs are where this module expects them, and falls back to the
SDK's public path otherwise; tests/test_telemetry_fast.py and tests/test_telemetry_otlp.py pin
that the fast output equals the public path's, span for span and byte for byte. The versions
verified are `VERIFIED` (pinned in pyproject.toml with `~=`); tests/test_sdk_internals.py fails
when the installed ones differ, so an upgrade is a deliberate act: rerun those tests, re-read
the names below in the new SDK, then move the pins.

Private names used, and why:

- `CompositePropagator._propagators`: to see that the global propagator is W3C `tracecontext`
  (+ `baggage`), whose headers `Telemetry` reads and writes directly.
- `SpanProcessor._on_ending` (and the batch and simple processors'): a processor is "end only"
  when its `on_start` and `_on_ending` are the base no-ops; only then may spans reach it
  already finished.
- `Tracer._span_limits`: the fast paths add no attribute bounding, so they run only when no
  count or length limit can bite.
- `Tracer._instrumentation_scope`: the scope a directly built span carries, as the SDK's span
  takes it at start.
- `Tracer._is_enabled`: a tracer configurator may disable a tracer; then the SDK's path.
- `SynchronousMultiSpanProcessor._span_processors`: the provider's processors, to check that
  each is end only (`add_span_processor` replaces the tuple, so a changed identity is noticed).
- `sampling._AlwaysOn`, `sampling._ParentBasedAlwaysOn`, `sampling._ParentBasedAlwaysOff`: the
  classes of the built-in samplers that sample every child of a sampled parent.

Public but not part of the API contract, used the same way: `Tracer.sampler`, `.id_generator`,
`.span_processor`, `.resource`, `.instrumentation_info`, and `ReadableSpan(...)`'s constructor.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, sampling
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import (
    Link,
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

__all__ = [
    "VERIFIED",
    "Phase",
    "Root",
    "children_follow_root",
    "direct_children",
    "direct_root",
    "end_only",
    "fast_paths",
    "is_w3c_textmap",
    "span_processors",
]

# The releases whose internals the names above were read in (major.minor).
VERIFIED = {
    "opentelemetry-api": "1.45",
    "opentelemetry-sdk": "1.45",
    "opentelemetry-exporter-otlp-proto-common": "1.45",
    "opentelemetry-proto": "1.45",
}

# (name, start ns, end ns, attributes, error status) of a phase child.
Phase = tuple[str, int, int, dict[str, types.AnyValue], Status | None]

EMPTY_CONTEXT = Context()  # what extract() returns for a carrier without W3C headers
_W3C_PROPAGATORS = {TraceContextTextMapPropagator, W3CBaggagePropagator}
# Processors whose on_start/_on_ending do nothing: they only need on_end, which takes a ReadableSpan.
_NOOP_ON_START = {SpanProcessor.on_start, SimpleSpanProcessor.on_start, BatchSpanProcessor.on_start}
_NOOP_ON_ENDING = {getattr(cls, "_on_ending", None) for cls in (SpanProcessor, SimpleSpanProcessor, BatchSpanProcessor)}
_RANDOM_TRACE_ID = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)  # W3C level 2 flag (newer SDKs)
_MAX_CHILD_ATTRIBUTES = 4  # `network` has the most
# The most attributes a root can carry: its own, with every request parameter, and proxy/accounting's
# at their bounds (header attributes, user.id, taotrace.key.id, rate limits, cost). Not counted by
# hand: tests/test_sdk_internals.py builds such a request and counts them, so a new one fails it.
_MAX_ROOT_ATTRIBUTES = 84
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_UNSET = Status(StatusCode.UNSET)

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


def is_w3c_textmap(propagator: object) -> bool:
    """True for `tracecontext` or `tracecontext,baggage` (the default): headers we can read and write directly."""
    if type(propagator) is CompositePropagator:
        parts = getattr(propagator, "_propagators", None)
    else:
        parts = (propagator,)
    if not parts:
        return False
    kinds = {type(p) for p in parts}
    return TraceContextTextMapPropagator in kinds and kinds <= _W3C_PROPAGATORS


def end_only(processor: object) -> bool:
    cls = type(processor)
    return getattr(cls, "on_start", None) in _NOOP_ON_START and getattr(cls, "_on_ending", None) in _NOOP_ON_ENDING


def span_processors(tracer: object) -> tuple[object, ...] | None:
    """The provider's processor tuple (a new tuple when one is added), or None when it cannot be read."""
    processors = getattr(getattr(tracer, "span_processor", None), "_span_processors", None)
    return processors if isinstance(processors, tuple) else None


def children_follow_root(sampler: object) -> bool:
    return any(sampler is s for s in _FOLLOWING_SAMPLERS) or type(sampler) in _FOLLOWING_SAMPLER_TYPES


def _sdk_internal_metrics_enabled() -> bool:
    return os.environ.get("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "").strip().lower() == "true"


def fast_paths(tracer: object) -> tuple[bool, bool]:
    """(children, root): whether this tracer lets spans be built directly, as the SDK would build them."""
    limits = getattr(tracer, "_span_limits", None)
    max_attrs = getattr(limits, "max_span_attributes", 0)
    children = (
        isinstance(tracer, SdkTracer)
        and all(hasattr(tracer, a) for a in ("sampler", "id_generator", "span_processor"))
        and (max_attrs is None or max_attrs >= _MAX_CHILD_ATTRIBUTES)
        and not _sdk_internal_metrics_enabled()  # the SDK would count each child span
    )
    # The root too, when its attributes need no bounding (no count or length limit can bite)
    # and the SDK pieces it copies are where this version keeps them.
    root = (
        children
        and (max_attrs is None or max_attrs >= _MAX_ROOT_ATTRIBUTES)
        and getattr(limits, "max_span_attribute_length", 0) is None
        and all(hasattr(tracer, a) for a in ("resource", "instrumentation_info", "_instrumentation_scope"))
        and hasattr(getattr(tracer, "id_generator", None), "is_trace_id_random")
        and hasattr(TraceFlags, "random_trace_id")
    )
    return children, root


class Root(Span):
    """The request's root span built directly (see `direct_root`).

    Holds what Tracer.start_span's `_Span` would hold, as a plain dict of attributes (Telemetry
    only sets valid values; lists become tuples as BoundedAttributes makes them), and on `end`
    hands the processors the same `ReadableSpan` the SDK would. It lives on the event loop only,
    so it needs no lock. Links come only at start; Telemetry never adds events or links later: `add_event`,
    `add_link` and `record_exception` are accepted and ignored.
    """

    __slots__ = (
        "_tracer",
        "_name",
        "_context",
        "parent",
        "attributes",
        "_start",
        "_status",
        "_ended",
        "resource",
        "instrumentation_scope",
        "links",
    )

    def __init__(
        self,
        tracer: SdkTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, types.AnyValue],
        start: int,
        links: tuple[Link, ...] = (),
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._context = context
        self.parent = parent
        self.attributes = attributes
        self._start = start
        self._status = _UNSET
        self._ended = False
        self.resource = tracer.resource  # what the SDK span takes at start
        self.instrumentation_scope = tracer._instrumentation_scope
        self.links = links  # given at start (`--parent link`: the caller's span), as the SDK takes them

    def get_span_context(self) -> SpanContext:
        return self._context

    @property
    def name(self) -> str:
        return self._name

    @property
    def start_time(self) -> int:
        return self._start

    def is_recording(self) -> bool:
        return not self._ended

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        if self._ended:
            return
        mine = self.attributes
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

    def drop(self) -> None:
        """End without handing anything to the processors (outcome sampling dropped the trace)."""
        self._ended = True

    def end(self, end_time: int | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        tracer = self._tracer
        tracer.span_processor.on_end(
            ReadableSpan(
                self._name,
                context=self._context,
                parent=self.parent,
                resource=self.resource,
                attributes=self.attributes,
                kind=SpanKind.CLIENT,
                instrumentation_info=tracer.instrumentation_info,
                status=self._status,
                start_time=self._start,
                end_time=end_time if end_time is not None else time.time_ns(),
                instrumentation_scope=self.instrumentation_scope,
                links=self.links,
            )
        )


def direct_root(
    tracer: SdkTracer,
    name: str,
    context: Context,
    attributes: dict[str, types.AnyValue],
    start: int,
    links: tuple[Link, ...] = (),
) -> Span:
    """Tracer.start_span's steps, in its order (ids, sampler), without a live SDK span.

    Only for the built-in samplers (whose result carries exactly the attributes given) and
    end-only processors (nothing to call at start). ~5 us instead of ~19 us for start + inject.
    """
    enabled = getattr(tracer, "_is_enabled", None)  # a tracer configurator may disable it
    if enabled is not None and not enabled():
        return tracer.start_span(
            name, context=context, kind=SpanKind.CLIENT, attributes=attributes, start_time=start, links=links or None
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
    result = tracer.sampler.should_sample(context, trace_id, name, SpanKind.CLIENT, attributes, links)
    flags = _SAMPLED if result.decision is Decision.RECORD_AND_SAMPLE else _NOT_SAMPLED
    if random_trace_id:
        flags = TraceFlags(flags | _RANDOM_TRACE_ID)
    span_context = SpanContext(trace_id, ids.generate_span_id(), False, flags, result.trace_state)
    if result.decision is Decision.DROP:
        return NonRecordingSpan(span_context)
    return Root(tracer, name, span_context, parent, attributes, start, links)


def direct_children(
    tracer: SdkTracer,
    root: Span,
    phases: list[Phase],
    follows: bool,
    general: Callable[[Context, Phase], None],
) -> None:
    """The phase children as finished spans, exactly as Tracer.start_span + end would make them.

    `follows`: the sampler samples every child of this (sampled) root, so it need not be asked.
    `general`: makes one child through the SDK's path (for a sampler that adds attributes).
    """
    parent = root.get_span_context()
    trace_id = parent.trace_id
    sampler = tracer.sampler
    ctx = trace.set_span_in_context(root) if not follows else EMPTY_CONTEXT
    new_span_id = tracer.id_generator.generate_span_id
    on_end = tracer.span_processor.on_end
    # Root and the SDK's own span both carry these (the API's Span does not declare them).
    resource = root.resource  # type: ignore[attr-defined]
    scope = root.instrumentation_scope  # type: ignore[attr-defined]
    info = tracer.instrumentation_info
    # A sampled child of a local parent: SAMPLED, plus the parent's random-trace-id flag.
    flags = TraceFlags(TraceFlags.SAMPLED | (parent.trace_flags & _RANDOM_TRACE_ID))
    trace_state: TraceState | None = parent.trace_state
    for phase in phases:
        name, start, end, attrs, status = phase
        if not follows:  # ask the sampler, as Tracer.start_span would
            result = sampler.should_sample(ctx, trace_id, name, SpanKind.INTERNAL, None, ())
            if result.attributes:  # a custom sampler's attributes: let the SDK merge and bound them
                general(ctx, phase)
                continue
            if result.decision is not Decision.RECORD_AND_SAMPLE:
                new_span_id()  # the SDK gives an unsampled span an id too
                continue  # dropped, or recorded only: end-only processors export neither
            trace_state = result.trace_state
        on_end(
            ReadableSpan(
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
        )
