"""Head sampling: which new spans are recorded and exported, as `OTEL_TRACES_SAMPLER` asks.

The built-in samplers are the OpenTelemetry specification's (`always_on`, `always_off`,
`traceidratio`, and `parentbased_*` over them; `parentbased_always_on` by default), written here
so the proxy needs no SDK span machinery: each is a pure function of the parent's context and the
trace id. Any other `OTEL_TRACES_SAMPLER` value names a sampler registered under the
`opentelemetry_traces_sampler` entry point group (the SDK's own extension point); such a sampler
is an SDK `Sampler` and is called through its public `should_sample` (slower: the proxy must then
build an API `Context` for it, and ask it for every phase child too).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceState
from opentelemetry.util.types import AnyValue

__all__ = [
    "ALWAYS_OFF",
    "ALWAYS_ON",
    "DEFAULT",
    "AlwaysOff",
    "AlwaysOn",
    "ParentBased",
    "Sampler",
    "Sampling",
    "SdkSampler",
    "TraceIdRatio",
    "ratio_bound",
    "sampler_from_env",
]

log = logging.getLogger("taotrace")

ENTRY_POINT_GROUP = "opentelemetry_traces_sampler"
TRACE_ID_LIMIT = (1 << 64) - 1  # the spec's ratio rule reads the trace id's lower 64 bits


@dataclass(frozen=True, slots=True)
class Sampling:
    """A sampler's answer. `recorded` without `sampled` (RECORD_ONLY) is never exported."""

    sampled: bool
    recorded: bool
    trace_state: TraceState | None = None  # None: the parent's (or empty for a root)
    attributes: Mapping[str, AnyValue] | None = None


SAMPLE = Sampling(True, True)
DROP = Sampling(False, False)


class Sampler(Protocol):
    """Decides whether a new span is sampled.

    `follows`: every child of a sampled span is sampled too, with the parent's trace state and no
    attributes of the sampler's own, so the phase children of a sampled root need not ask.
    `reads_attributes` (optional, True when absent): whether the decision may depend on the span's
    attributes; when False, the root's are made only when the request ends.
    """

    @property
    def follows(self) -> bool: ...

    def should_sample(
        self,
        parent: SpanContext | None,
        trace_id: int,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, AnyValue] | None,
        links: Sequence[Link],
        context: Context | None,
    ) -> Sampling:
        """`parent`: the parent's context (None for a root); `context`: the API context the parent
        came from, when the caller extracted one (only SDK samplers read it, e.g. for baggage)."""
        ...


class AlwaysOn:
    follows = True
    reads_attributes = False

    def should_sample(self, *_: Any) -> Sampling:
        return SAMPLE

    def __repr__(self) -> str:
        return "AlwaysOn"


class AlwaysOff:
    follows = False
    reads_attributes = False

    def should_sample(self, *_: Any) -> Sampling:
        return DROP

    def __repr__(self) -> str:
        return "AlwaysOff"


ALWAYS_ON = AlwaysOn()
ALWAYS_OFF = AlwaysOff()


def ratio_bound(ratio: float) -> int:
    """The spec's bound: a trace id whose lower 64 bits are below it is sampled."""
    return round(ratio * (TRACE_ID_LIMIT + 1))


class TraceIdRatio:
    """Samples the fraction `ratio` of trace ids, the same ones in every process with that ratio."""

    follows = True  # a child has its root's trace id, hence its decision
    reads_attributes = False

    def __init__(self, ratio: float) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError("the sampling ratio must be between 0 and 1")
        self.ratio = ratio
        self.bound = ratio_bound(ratio)

    def should_sample(self, parent: SpanContext | None, trace_id: int, *_: Any) -> Sampling:
        return SAMPLE if trace_id & TRACE_ID_LIMIT < self.bound else DROP

    def __repr__(self) -> str:
        return f"TraceIdRatio({self.ratio})"


class ParentBased:
    """A span with a parent follows the parent's sampled flag; a root asks `root`."""

    def __init__(
        self,
        root: Sampler,
        *,
        remote_sampled: Sampler = ALWAYS_ON,
        remote_not_sampled: Sampler = ALWAYS_OFF,
        local_sampled: Sampler = ALWAYS_ON,
        local_not_sampled: Sampler = ALWAYS_OFF,
    ) -> None:
        self.root = root
        self.remote_sampled = remote_sampled
        self.remote_not_sampled = remote_not_sampled
        self.local_sampled = local_sampled
        self.local_not_sampled = local_not_sampled

    @property
    def follows(self) -> bool:
        return self.local_sampled.follows

    @property
    def reads_attributes(self) -> bool:
        delegates = (
            self.root,
            self.remote_sampled,
            self.remote_not_sampled,
            self.local_sampled,
            self.local_not_sampled,
        )
        return any(getattr(delegate, "reads_attributes", True) for delegate in delegates)

    def should_sample(
        self,
        parent: SpanContext | None,
        trace_id: int,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, AnyValue] | None,
        links: Sequence[Link],
        context: Context | None,
    ) -> Sampling:
        if parent is None or not parent.is_valid:
            delegate = self.root
        elif parent.is_remote:
            delegate = self.remote_sampled if parent.trace_flags.sampled else self.remote_not_sampled
        else:
            delegate = self.local_sampled if parent.trace_flags.sampled else self.local_not_sampled
        return delegate.should_sample(parent, trace_id, name, kind, attributes, links, context)

    def __repr__(self) -> str:
        return f"ParentBased({self.root!r})"


DEFAULT = ParentBased(ALWAYS_ON)


class SdkSampler:
    """An OpenTelemetry SDK sampler (a user's, from an entry point), called through its public API."""

    follows = False  # it may decide per span name, or add attributes: ask it for every child
    reads_attributes = True

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def should_sample(
        self,
        parent: SpanContext | None,
        trace_id: int,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, AnyValue] | None,
        links: Sequence[Link],
        context: Context | None,
    ) -> Sampling:
        if context is None:
            context = Context() if parent is None else trace.set_span_in_context(NonRecordingSpan(parent))
        result = self.sampler.should_sample(context, trace_id, name, kind, attributes, links)
        decision = result.decision
        return Sampling(
            sampled=decision.is_sampled(),
            recorded=decision.is_recording(),
            # As the SDK's tracer takes it: a sampler that names no trace state gives the span none.
            trace_state=result.trace_state if result.trace_state is not None else TraceState(),
            attributes=dict(result.attributes) if result.attributes else None,
        )

    def __repr__(self) -> str:
        return f"SdkSampler({self.sampler!r})"


def _ratio(arg: str | None) -> float:
    if arg is None or not arg.strip():
        return 1.0
    try:
        ratio = float(arg)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        log.warning("OTEL_TRACES_SAMPLER_ARG is not a ratio between 0 and 1; sampling everything")
        return 1.0
    return ratio


def sampler_from_env(env: Mapping[str, str]) -> Sampler:
    """`OTEL_TRACES_SAMPLER` (+ `OTEL_TRACES_SAMPLER_ARG`), as the specification defines them."""
    raw = env.get("OTEL_TRACES_SAMPLER", "").strip()
    name = raw.lower() or "parentbased_always_on"
    arg = env.get("OTEL_TRACES_SAMPLER_ARG")
    if name == "always_on":
        return ALWAYS_ON
    if name == "always_off":
        return ALWAYS_OFF
    if name == "traceidratio":
        return TraceIdRatio(_ratio(arg))
    if name == "parentbased_always_on":
        return DEFAULT
    if name == "parentbased_always_off":
        return ParentBased(ALWAYS_OFF)
    if name == "parentbased_traceidratio":
        return ParentBased(TraceIdRatio(_ratio(arg)))
    # A plug-in, found as the SDK finds it: its entry point's name as given (case matters), its
    # factory called with the argument as set (None when unset).
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == raw]
    if not found:
        log.warning("unknown OTEL_TRACES_SAMPLER %r; using parentbased_always_on", raw)
        return DEFAULT
    try:
        plugin = found[0].load()(arg)
    except Exception as error:  # noqa: BLE001 - a broken plug-in must not stop the proxy
        log.warning("could not load the sampler %r (%s); using parentbased_always_on", raw, type(error).__name__)
        return DEFAULT
    if not callable(getattr(plugin, "should_sample", None)):
        log.warning("the sampler %r has no should_sample; using parentbased_always_on", raw)
        return DEFAULT
    return SdkSampler(plugin)
