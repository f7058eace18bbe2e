"""Prometheus metrics from finished requests: the contract's names, bounded labels, exemplars.

The families live on our own `exposition.Registry` (rendered fast, see exposition.py); adding a
family is one declaration in `Metrics.__init__`. When a prometheus_client `CollectorRegistry` is
passed in, the families are registered there as a collector too (tests read values through it).
A request updates its histograms once, when it ends, from its frozen `RequestRecord`; the label
children for an (upstream, api, model) triple are created once and reused. Every family that
describes requests carries `upstream`, the route's name (`--route NAME:/prefix=URL`, by default
derived from the upstream's URL: `proxy.config.routes.derived_names`): bounded by the configuration.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry

from proxy.errors import ERROR_TYPES
from proxy.exchange.record import UNKNOWN_MODEL, RequestRecord
from proxy.telemetry.exposition import Counter, Gauge, Histogram, HistogramChild, Registry, ValueChild

__all__ = [
    "Recorder", "ERROR_TYPES", "Metrics", "ModelLabels", "BUCKETS_LATENCY", "BUCKETS_OVERHEAD", "BUCKETS_RTT",
    "BUCKETS_TOKEN", "SPAN_DROP_REASONS",
]  # fmt: skip

# 1 ms … 20 min: reasoning models can think for minutes before the first token.
BUCKETS_LATENCY = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75,
    1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
)  # fmt: skip
# Per-token times: 0.5 ms (fast small models, batched) … 2.5 s (a stalled decode).
BUCKETS_TOKEN = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
# Network round trips: 0.5 ms (same rack) … 1 s (a satellite link). Few buckets: each is one more
# series per (api, model), and /metrics render time grows with the series.
BUCKETS_RTT = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1.0)

# The proxy's own cost: 10 us ... 100 ms (a relay is a few us; a slow one means a busy event loop).
BUCKETS_OVERHEAD = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
)  # fmt: skip

# ERROR_TYPES (re-exported): the whole `error_type` vocabulary, as proxy/errors.py defines it.

# taotrace_spans_dropped_total{reason}: each pre-created at 0.
SPAN_DROP_REASONS = ("queue_full", "export_failed")

OTHER_MODEL = "other"


@dataclass
class ModelLabels:
    """Bounds the `model` label: an allow-list when given, else the first `limit` names seen."""

    allowlist: frozenset[str] = frozenset()
    limit: int = 100
    _seen: set[str] = field(default_factory=set)

    def __call__(self, model: str | None) -> str:
        if not model:
            return UNKNOWN_MODEL
        if self.allowlist:
            return model if model in self.allowlist else OTHER_MODEL
        if model in self._seen:
            return model
        if len(self._seen) < self.limit:
            self._seen.add(model)
            return model
        return OTHER_MODEL


class _Children:
    """The label children of one (upstream, api, model) triple, created once."""

    __slots__ = (
        "duration",
        "ttft",
        "ttfat",
        "thinking",
        "tpot",
        "itl",
        "network",
        "prefill",
        "decode",
        "tok_in",
        "tok_out",
        "tok_cached",
        "tok_reasoning",
        "rtt",
        "retransmits",
        "outcomes",
    )

    def __init__(self, m: Metrics, upstream: str, api: str, model: str) -> None:
        # taotrace_requests_total's child per (status code, error type): a dict hit on the ints,
        # where `labels()` would build and hash a tuple of strings every request.
        self.outcomes: dict[tuple[int, str], ValueChild] = {}
        um = (upstream, api, model)
        self.duration = m.duration.labels(*um)
        self.ttft = m.ttft.labels(*um)
        self.ttfat = m.ttfat.labels(*um)
        self.thinking = m.thinking.labels(*um)
        self.tpot = m.tpot.labels(*um)
        self.itl = m.itl.labels(*um)
        self.network = m.phase.labels(*um, "network")
        self.prefill = m.phase.labels(*um, "prefill_wait")
        self.decode = m.phase.labels(*um, "decode")
        self.tok_in = m.tokens.labels(*um, "input")
        self.tok_out = m.tokens.labels(*um, "output")
        self.tok_cached = m.tokens.labels(*um, "cached_input")
        self.tok_reasoning = m.tokens.labels(*um, "reasoning")
        self.rtt = m.rtt.labels(*um)
        self.retransmits = m.retransmits.labels(*um)


class _Attributed:
    """The `taotrace_attributed_*` counters: requests, tokens and cost per --metric-label value.

    Registered only when labels are asked for, so without them not one new series appears.
    Each label is bounded like `model`: the first `limit` values, then `other`.
    """

    def __init__(self, registry: Registry, attributes: Sequence[str], labels: Sequence[str], limit: int) -> None:
        self.attributes = tuple(attributes)
        self.values = tuple(ModelLabels(limit=limit) for _ in attributes)
        extra = tuple(labels)
        self.requests = Counter(
            "taotrace_attributed_requests", "Requests by outcome and --metric-label attributes.",
            ("upstream", "api", "model", "error_type", *extra), registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "taotrace_attributed_tokens", "Tokens by type and --metric-label attributes.",
            ("upstream", "api", "model", "type", *extra), registry=registry,
        )  # fmt: skip
        self.cost = Counter(
            "taotrace_attributed_cost", "Cost (price-table currency) by --metric-label attributes.",
            ("upstream", "api", "model", *extra), registry=registry,
        )  # fmt: skip

    def record(self, rec: RequestRecord, model: str) -> None:
        given = dict(rec.attributes)
        values = tuple(bound(given.get(name)) for name, bound in zip(self.attributes, self.values, strict=True))
        where = (rec.upstream, rec.api, model)
        self.requests.labels(*where, rec.error_type, *values).inc()
        u = rec.usage
        for kind, n in (
            ("input", u.input_tokens),
            ("output", u.output_tokens),
            ("cached_input", u.cached_input_tokens),
            ("reasoning", u.reasoning_tokens),
        ):
            if n:
                self.tokens.labels(*where, kind, *values).inc(n)
        if rec.cost is not None and rec.cost.amount is not None:
            self.cost.labels(*where, *values).inc(rec.cost.amount)


PAIRS_KEPT = 4096  # --mirror: records waiting for their pair's other half; the oldest go first


class _Mirror:
    """`--mirror`: the two records of each pair (shared `pair_id`), the first kept until the
    second arrives, then the difference mirror − primary of TTFT and TPOT observed.

    A Prometheus histogram holds no negative values, so the difference is split by sign: its
    size goes to the `direction` = `mirror_slower` (mirror − primary > 0, or 0) or
    `mirror_faster` series. A pair's share per direction is the ratio of the `_count`s; a
    quantile is read per direction."""

    def __init__(self, registry: Registry) -> None:
        labels = ("upstream", "mirror", "api", "model", "direction")
        self.ttft = Histogram(
            "taotrace_compare_ttft_difference_seconds",
            "--mirror pairs: |mirror TTFT - primary TTFT|, direction says which was slower.",
            labels, buckets=BUCKETS_LATENCY, registry=registry,
        )  # fmt: skip
        self.tpot = Histogram(
            "taotrace_compare_tpot_difference_seconds",
            "--mirror pairs: |mirror TPOT - primary TPOT|, direction says which was slower.",
            labels, buckets=BUCKETS_TOKEN, registry=registry,
        )  # fmt: skip
        self.requests = Counter(
            "taotrace_mirror_requests", "--mirror copies sent, by the mirror's route and outcome.",
            ("upstream", "api", "error_type"), registry=registry,
        )  # fmt: skip
        self.dropped = Counter(
            "taotrace_mirror_dropped", "--mirror copies not sent: a cap (per_minute, concurrency) was reached.",
            ("reason",), registry=registry,
        )  # fmt: skip
        self.waiting: OrderedDict[str, RequestRecord] = OrderedDict()

    def see(self, rec: RequestRecord, model: str) -> None:
        assert rec.pair_id is not None
        other = self.waiting.pop(rec.pair_id, None)
        if other is None:
            self.waiting[rec.pair_id] = rec
            if len(self.waiting) > PAIRS_KEPT:
                self.waiting.popitem(last=False)
            return
        primary, mirror = (other, rec) if rec.mirror else (rec, other)
        if primary.error_type or mirror.error_type or primary.mirror == mirror.mirror:
            return  # only two good answers compare
        where = (primary.upstream, mirror.upstream, primary.api, model)
        for family, a, b in (
            (self.ttft, primary.timing.ttft, mirror.timing.ttft),
            (self.tpot, primary.timing.tpot, mirror.timing.tpot),
        ):
            if a is not None and b is not None:
                d = b - a
                family.labels(*where, "mirror_faster" if d < 0 else "mirror_slower").observe(abs(d))


class Recorder(Protocol):
    """What the forwarder records to (`Metrics`)."""

    in_flight: Gauge
    sink_errors: Counter  # taotrace_sink_errors_total{sink}: records a sink failed on
    sink_name: str  # what `record` is counted under there

    def record(self, rec: RequestRecord) -> None: ...


class Metrics:
    """The `taotrace_*` metrics on one registry."""

    sink_name = "metrics"

    def __init__(
        self,
        collector_registry: CollectorRegistry | None = None,
        models: ModelLabels | None = None,
        *,
        attribute_labels: Sequence[tuple[str, str]] = (),
        attribute_label_values: int = 20,
    ) -> None:
        """`attribute_labels`: (attribute name, label name) pairs for the `taotrace_attributed_*` counters."""
        self.registry = registry = Registry()  # every family below registers here
        self.models = models or ModelLabels()
        am = ("upstream", "api", "model")
        self.requests = Counter(
            "taotrace_requests",
            "Requests forwarded, by outcome.",
            (*am, "status_code", "error_type"),
            registry=registry,
        )
        self.duration = Histogram(
            "taotrace_request_duration_seconds", "Request head arrival to last byte written to the client.",
            am, buckets=BUCKETS_LATENCY, registry=registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "taotrace_time_to_first_token_seconds", "Request head arrival to the first token event (streams only).",
            am, buckets=BUCKETS_LATENCY, registry=registry,
        )  # fmt: skip
        self.ttfat = Histogram(
            "taotrace_time_to_first_answer_token_seconds",
            "Request head arrival to the answer's first token (text, refusal, tool call), after any streamed "
            "reasoning (streams only).",
            am, buckets=BUCKETS_LATENCY, registry=registry,
        )  # fmt: skip
        self.thinking = Histogram(
            "taotrace_thinking_seconds",
            "Streamed reasoning before the answer: first token (a reasoning one) to the answer's first token. "
            "Measured only; hidden reasoning's estimate is never observed here.",
            am, buckets=BUCKETS_LATENCY, registry=registry,
        )  # fmt: skip
        self.tpot = Histogram(
            "taotrace_time_per_output_token_seconds", "(last token - first token) / (output tokens - 1), per stream.",
            am, buckets=BUCKETS_TOKEN, registry=registry,
        )  # fmt: skip
        self.itl = Histogram(
            "taotrace_inter_token_latency_seconds", "Gap between consecutive token events.",
            am, buckets=BUCKETS_TOKEN, registry=registry,
        )  # fmt: skip
        self.phase = Histogram(
            "taotrace_phase_duration_seconds", "Time in each phase: network, prefill_wait, decode.",
            (*am, "phase"), buckets=BUCKETS_LATENCY, registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "taotrace_tokens", "Tokens by type: input (incl. cached), output, cached_input, reasoning.",
            (*am, "type"), registry=registry,
        )  # fmt: skip
        self.rtt = Histogram(
            "taotrace_upstream_rtt_seconds",
            "Round trip to the upstream per request: its connection's TCP min_rtt (Linux TCP_INFO).",
            am, buckets=BUCKETS_RTT, registry=registry,
        )  # fmt: skip
        self.retransmits = Counter(
            "taotrace_upstream_retransmits",
            "TCP segments taotrace retransmitted to the upstream during requests (Linux TCP_INFO).",
            am, registry=registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            "taotrace_in_flight_requests", "Requests being forwarded now.", ("upstream", "api"), registry=registry,
            summed=True,
        )  # fmt: skip
        self.overhead = Histogram(
            "taotrace_proxy_overhead_seconds",
            "The proxy's own time: request (head arrival to upstream write, minus pool wait, DNS, connect) "
            "and relay (per upstream read, to the client socket).",
            ("upstream", "api", "stage"), buckets=BUCKETS_OVERHEAD, registry=registry,
        )  # fmt: skip
        self.ratelimit_remaining = Gauge(
            "taotrace_ratelimit_remaining", "Requests or tokens left in the upstream's rate-limit window (last response).",
            ("upstream", "model", "kind"), registry=registry,
        )  # fmt: skip
        self.ratelimit_limit = Gauge(
            "taotrace_ratelimit_limit", "The upstream's rate limit for the window (last response).",
            ("upstream", "model", "kind"), registry=registry,
        )  # fmt: skip
        self.ratelimit_reset = Gauge(
            "taotrace_ratelimit_reset_timestamp_seconds", "When the upstream's rate-limit window is replenished (epoch s).",
            ("upstream", "model", "kind"), registry=registry,
        )  # fmt: skip
        self.cost = Counter(
            "taotrace_cost", "Cost of the requests, from the --prices table (in its currency).", am, registry=registry
        )
        self.cost_unpriced = Counter(
            "taotrace_cost_unpriced_requests", "Requests with reported usage whose model has no price (never guessed).",
            am, registry=registry,
        )  # fmt: skip
        self.cost_cache_savings = Counter(
            "taotrace_cost_cache_savings", "Cached input tokens at the input price minus what they cost.",
            am, registry=registry,
        )  # fmt: skip
        self.attributed = (
            _Attributed(
                registry, [a for a, _ in attribute_labels], [n for _, n in attribute_labels], attribute_label_values
            )
            if attribute_labels
            else None
        )
        self.worker_restarts = Counter(
            "taotrace_worker_restarts", "Worker processes that died and were restarted (--workers).", registry=registry
        )
        self.worker_restarts.labels()  # 0 from the start, in one process too
        self.sink_errors = Counter(
            "taotrace_sink_errors", "Finished requests' records a sink (metrics, spans, live_view, ...) failed on.",
            ("sink",), registry=registry,
        )  # fmt: skip
        self.spans_dropped = Counter(
            "taotrace_spans_dropped",
            "Finished spans never delivered: queue_full (the export queue was full: the collector is down "
            "or slow) or export_failed (in a batch the exporter gave up on).",
            ("reason",), registry=registry,
        )  # fmt: skip
        self._span_drops = {reason: self.spans_dropped.labels(reason) for reason in SPAN_DROP_REASONS}  # 0 at start
        self.mirror = _Mirror(registry)
        self._children: dict[tuple[str, str, str], _Children] = {}
        self._overhead: dict[tuple[str, str], tuple[HistogramChild, HistogramChild]] = {}
        if collector_registry is not None:
            collector_registry.register(registry)

    def children(self, api: str, model_label: str, upstream: str = "") -> _Children:
        key = (upstream, api, model_label)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = _Children(self, upstream, api, model_label)
        return found

    def record(self, rec: RequestRecord) -> None:
        """Account one finished request (a `--mirror` copy: only in the mirror and compare families)."""
        model = self.models(rec.model)
        if rec.pair_id is not None:
            self.mirror.see(rec, model)
            if rec.mirror:
                self.mirror.requests.labels(rec.upstream, rec.api, rec.error_type).inc()
                return
        c = self.children(rec.api, model, rec.upstream)
        t = rec.timing
        exemplar = {"trace_id": rec.trace_id} if rec.trace_id else None
        outcome = c.outcomes.get((rec.status_code, rec.error_type))
        if outcome is None:
            outcome = c.outcomes[(rec.status_code, rec.error_type)] = self.requests.labels(
                rec.upstream, rec.api, model, str(rec.status_code), rec.error_type
            )
        outcome.inc()
        c.duration.observe(t.duration, exemplar)
        if t.network is not None:
            c.network.observe(t.network, exemplar)
        if rec.stream and t.ttft is not None:
            c.ttft.observe(t.ttft, exemplar)
            if t.prefill_wait is not None:
                c.prefill.observe(t.prefill_wait, exemplar)
            if t.decode is not None:
                c.decode.observe(t.decode, exemplar)
            if t.tpot is not None:
                c.tpot.observe(t.tpot, exemplar)
            if t.time_to_first_answer_token is not None:
                c.ttfat.observe(t.time_to_first_answer_token, exemplar)
            if t.thinking is not None:  # measured only: thinking_estimated never enters a histogram
                c.thinking.observe(t.thinking, exemplar)
            c.itl.observe_many(t.itl, exemplar)  # the exemplar on the slowest gap only
        found = self._overhead.get((rec.upstream, rec.api))
        if found is None:
            found = self._overhead[(rec.upstream, rec.api)] = (
                self.overhead.labels(rec.upstream, rec.api, "request"),
                self.overhead.labels(rec.upstream, rec.api, "relay"),
            )
        if t.overhead_request is not None:
            found[0].observe(t.overhead_request, exemplar)
        found[1].observe_many(t.relay, exemplar)  # the exemplar on the slowest relay
        tcp = rec.tcp
        if tcp is not None:
            rtt = tcp.round_trip
            if rtt is not None:
                c.rtt.observe(rtt, exemplar)
            if tcp.retransmits:
                c.retransmits.inc(tcp.retransmits)
        u = rec.usage
        if u.input_tokens:
            c.tok_in.inc(u.input_tokens)
        if u.output_tokens:
            c.tok_out.inc(u.output_tokens)
        if u.cached_input_tokens:
            c.tok_cached.inc(u.cached_input_tokens)
        if u.reasoning_tokens:
            c.tok_reasoning.inc(u.reasoning_tokens)
        if rec.rate_limits is not None and rec.model is not None:  # limits are per model: no model, no gauge
            self._rate_limits(rec, model)
        cost = rec.cost
        if cost is not None:
            if cost.amount is None:
                self.cost_unpriced.labels(rec.upstream, rec.api, model).inc()
            else:
                self.cost.labels(rec.upstream, rec.api, model).inc(cost.amount)
                if cost.cache_savings:
                    self.cost_cache_savings.labels(rec.upstream, rec.api, model).inc(cost.cache_savings)
        if self.attributed is not None:
            self.attributed.record(rec, model)

    def span_dropped(self, reason: str, count: int) -> None:
        """`count` spans dropped for `reason`: the batch processor's `on_drop`."""
        child = self._span_drops.get(reason)
        if child is None:  # a reason of a future processor: counted under its own name, bounded by the code
            child = self._span_drops[reason] = self.spans_dropped.labels(reason)
        child.inc(count)

    def record_lost(self, upstream: str, api: str, count: int) -> None:
        """`count` requests whose worker died while they ran: outcome `worker_lost`, and nothing
        else is known of them (no model, no status, no timings)."""
        self.requests.labels(upstream, api, UNKNOWN_MODEL, "0", "worker_lost").inc(count)

    def _rate_limits(self, rec: RequestRecord, model: str) -> None:
        assert rec.rate_limits is not None
        observed = rec.rate_limits.observed_at
        for rl in rec.rate_limits.limits:
            if rl.remaining is not None:
                self.ratelimit_remaining.labels(rec.upstream, model, rl.kind).set(rl.remaining)
            if rl.limit is not None:
                self.ratelimit_limit.labels(rec.upstream, model, rl.kind).set(rl.limit)
            if rl.reset is not None:
                self.ratelimit_reset.labels(rec.upstream, model, rl.kind).set(observed + rl.reset)
