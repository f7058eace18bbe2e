"""A finished request's spans, built from its record by the span observer (`Spans.end`).

The root as it was started (same ids, start time and attributes, from the record's `SpanStart`),
its attributes from the record, and the phase children `network`, `prefill_wait` and `decode`
(with a reasoning model's `thinking` inside them) made from the frozen timing with explicit times: each handed to the span processor as
`SpanData` as it ends (see `spandata.py`, `tracing.py`).
"""

from __future__ import annotations

from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util.types import AnyValue

from proxy.exchange.record import RequestRecord
from proxy.exchange.timing import RequestTiming
from proxy.telemetry.spandata import UNSET, Resource, Scope, SpanData, SpanProcessor
from proxy.telemetry.tracing import SpanLimits, Tracing

__all__ = ["EMPTY_STATE", "FLAGS", "RANDOM_TRACE_ID", "SpanEnd", "bounded", "network_attributes"]

RANDOM_TRACE_ID = 0x02  # W3C Trace Context level 2: the trace id's right 7 bytes are random
EMPTY_STATE = TraceState()
FLAGS = tuple(TraceFlags(flags) for flags in range(256))  # each byte's TraceFlags, made once
_SAMPLED = TraceFlags.SAMPLED
_CLIENT, _INTERNAL = SpanKind.CLIENT, SpanKind.INTERNAL


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


def _reasoning_attributes(attrs: dict[str, AnyValue], t: RequestTiming) -> None:
    """A reasoning model's numbers (docs/timing.md): measured when it streamed its reasoning, the
    hidden reasoning's estimate (named as one) when it only reported it."""
    for key, value in (
        ("taotrace.answer.tpot", t.answer_tpot),
        ("taotrace.thinking", t.thinking),
        ("taotrace.thinking.total", t.thinking_total),
        ("taotrace.thinking.estimated", t.thinking_estimated),
    ):
        if value is not None:
            attrs[key] = value
    events, total = t.reasoning_token_events, t.thinking_total
    if events:
        attrs["taotrace.reasoning.token_events"] = events
        if total:  # the reasoning's own pace
            attrs["taotrace.reasoning.tpot"] = total / events


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


class SpanEnd:
    """Ends the spans of each finished request, with the sampler, ids and processor of `tracing`;
    `capture_content` / `capture_io_values` as `Spans`'."""

    def __init__(self, tracing: Tracing, scope: Scope, capture_content: bool, capture_io_values: bool) -> None:
        self.tracing = tracing
        self.scope = scope
        self.capture_content = capture_content
        self.capture_io_values = capture_io_values

    def end(self, rec: RequestRecord, offset: int) -> None:
        """The span observer: the root as it was started (same context, parent, links, start
        and attributes, from `rec.span`), its attributes from the record, its phase children, to
        the processor. `offset`: epoch ns minus monotonic ns, the timing's instants as span times."""
        seed = rec.span
        processor = self.tracing.processor
        if seed is None or processor is None or rec.sampling == "dropped":
            return  # nothing started for export, no exporter here, or nothing to make
        attributes: dict[str, AnyValue] = seed.attributes  # the span's own now
        self._end(
            processor, seed.name, seed.context, seed.parent, seed.start_time, seed.links, attributes, rec, seed.output,
            seed.output_value, offset, self.tracing.resource,
        )  # fmt: skip

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
        if t.time_to_first_answer_token is not None:
            attrs["taotrace.time_to_first_answer_token"] = t.time_to_first_answer_token
        if t.reasoning_token_events or t.answer_tpot is not None:  # a reasoning model's (none else has these)
            _reasoning_attributes(attrs, t)
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
        `decode` once a first token came, and a reasoning model's `thinking` inside them (one per
        reasoning run in decode; hidden reasoning's estimate at the end of prefill_wait, marked
        `taotrace.estimated`). A sampler that `follows` (the built-in ones) samples each with the
        root's trace state; another is asked for each, as for any child span."""
        t = rec.timing
        sent = t.sent
        start = int(t.start * 1e9) + offset
        end = int((t.end if sent is None else sent) * 1e9) + offset
        status = Status(StatusCode.ERROR, rec.error_type) if rec.error_type and sent is None else UNSET
        # name, start, end, attributes, status, parent (-1: the root; else the index of a phase above)
        phases: tuple[tuple[str, int, int, dict[str, AnyValue], Status, int], ...]
        if sent is None or t.first_token is None:
            phases = (("network", start, end, network_attributes(t), status, -1),)
        else:
            first = int(t.first_token * 1e9) + offset
            last = int(t.last_token * 1e9) + offset if t.last_token is not None else first
            phases = (
                ("network", start, end, network_attributes(t), status, -1),
                ("prefill_wait", end, first, {}, UNSET, -1),
                ("decode", first, last, {"taotrace.token_events": t.token_events}, UNSET, -1),
            )
            if t.thinking_spans or t.thinking_estimated is not None:
                phases += _thinking(t, offset, first)
        tracing, scope, trace_id = self.tracing, self.scope, parent.trace_id
        sampler, new_span_id, limits = tracing.sampler, tracing.ids.generate_span_id, tracing.limits
        flags = FLAGS[_SAMPLED | (parent.trace_flags & RANDOM_TRACE_ID)]
        follows, unbounded = sampler.follows, limits.length is None  # asked once, not per phase
        made: list[SpanContext] = []  # each phase's context, for a phase inside it
        for name, begin, finish, attrs, state_status, up in phases:
            above = parent if up < 0 else made[up]
            state = above.trace_state
            if not follows:
                result = sampler.should_sample(above, trace_id, name, SpanKind.INTERNAL, None, (), None)
                if result.trace_state is not None:
                    state = result.trace_state
                if not result.sampled:
                    # An unsampled span has an id too (the same ids as the SDK draws), and is the
                    # parent the sampler is asked about for the phases inside it, as in the SDK.
                    unsampled = FLAGS[parent.trace_flags & RANDOM_TRACE_ID]
                    made.append(SpanContext(trace_id, new_span_id(), False, unsampled, state))
                    continue
                if result.attributes:
                    attrs = {**attrs, **result.attributes}
            if unbounded and len(attrs) <= limits.count:  # the usual case: `bounded` would change nothing
                dropped = 0
            else:
                attrs, dropped = bounded(attrs, limits)
            context = SpanContext(trace_id, new_span_id(), False, flags, state)
            made.append(context)
            processor.on_end(
                SpanData(
                    name, context, above, _INTERNAL, begin, finish, attrs, resource, scope, state_status, (), (),
                    dropped,
                )
            )  # fmt: skip


_MEASURED: dict[str, AnyValue] = {"taotrace.estimated": False}
_ESTIMATED: dict[str, AnyValue] = {"taotrace.estimated": True}


def _thinking(
    t: RequestTiming, offset: int, first: int
) -> tuple[tuple[str, int, int, dict[str, AnyValue], Status, int], ...]:
    """The `thinking` children: each streamed reasoning run inside `decode` (phase 2), measured;
    or hidden reasoning's estimate ending at the first token, inside `prefill_wait` (phase 1)."""
    if t.thinking_estimated is not None:
        return (("thinking", first - int(t.thinking_estimated * 1e9), first, dict(_ESTIMATED), UNSET, 1),)
    runs = t.thinking_spans
    return tuple(
        ("thinking", int(runs[i] * 1e9) + offset, int(runs[i + 1] * 1e9) + offset, dict(_MEASURED), UNSET, 2)
        for i in range(0, len(runs) - 1, 2)
    )


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
