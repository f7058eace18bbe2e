"""GenAI semantic-convention metrics over OTLP, from finished requests.

`build_meter_provider` reads the standard `OTEL_*` variables (export only when
`OTEL_METRICS_EXPORTER` names exporters); `GenAIMetrics` is an observer of finished
`RequestRecord`s. On the event loop it only appends the frozen record to a queue; a worker thread
records it into our own histograms and counters (`aggregate.py`: a stream's chunk gaps at once),
and the pipeline's export thread (`metric_pipeline.py`) hands them to the SDK's exporters.
Names, units, buckets and attributes are the spec's (released names by default, the latest
experimental ones or both as `OTEL_SEMCONV_STABILITY_OPT_IN` asks: `proxy.telemetry.semconv`);
what the spec has no name for lives under `taotrace.*`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from proxy import __version__
from proxy.dialects import Usage
from proxy.exchange.record import RequestRecord
from proxy.telemetry.aggregate import AttributeSet, CounterInstrument, HistogramInstrument, temporality_from_env
from proxy.telemetry.metric_pipeline import DEFAULT_INTERVAL, DEFAULT_TIMEOUT, MetricPipeline, exporters_from_env
from proxy.telemetry.metrics import BUCKETS_LATENCY, BUCKETS_OVERHEAD, ERROR_TYPES, ModelLabels
from proxy.telemetry.otlp_env import sdk_disabled
from proxy.telemetry.semconv import LATEST_METRICS, RELEASED_METRICS, Conventions, MetricNames
from proxy.telemetry.tracing import resource_from_env

__all__ = [
    "BUCKETS",
    "BUCKETS_SPEC_SECONDS",
    "BUCKETS_SPEC_TOKENS",
    "GenAIMetrics",
    "build_meter_provider",
    "shutdown_meter_provider",
]

log = logging.getLogger("taotrace")

# The spec's ExplicitBucketBoundaries advice (v1.41.0, genai v0.1.0) for the gen_ai.client.* histograms.
BUCKETS_SPEC_SECONDS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
BUCKETS_SPEC_TOKENS = tuple(float(4**i) for i in range(14))  # 1, 4, 16, ... 67108864

DURATION = RELEASED_METRICS.duration
TOKEN_USAGE = RELEASED_METRICS.tokens
TIME_TO_FIRST_CHUNK = RELEASED_METRICS.time_to_first_chunk
TIME_PER_OUTPUT_CHUNK = RELEASED_METRICS.time_per_output_chunk
TIME_TO_FIRST_TOKEN = "taotrace.time_to_first_token"
TIME_TO_FIRST_ANSWER_TOKEN = "taotrace.time_to_first_answer_token"
THINKING = "taotrace.thinking"
PHASE_DURATION = "taotrace.phase.duration"
PROXY_OVERHEAD = "taotrace.proxy.overhead"
BUCKETS = {
    DURATION: BUCKETS_SPEC_SECONDS,
    TOKEN_USAGE: BUCKETS_SPEC_TOKENS,
    TIME_TO_FIRST_CHUNK: BUCKETS_SPEC_SECONDS,
    TIME_PER_OUTPUT_CHUNK: BUCKETS_SPEC_SECONDS,
    LATEST_METRICS.duration: BUCKETS_SPEC_SECONDS,
    LATEST_METRICS.time_to_first_chunk: BUCKETS_SPEC_SECONDS,
    LATEST_METRICS.time_per_output_chunk: BUCKETS_SPEC_SECONDS,
    # Ours: the /metrics buckets (1 ms ... 20 min), since reasoning models think for minutes.
    TIME_TO_FIRST_TOKEN: BUCKETS_LATENCY,
    TIME_TO_FIRST_ANSWER_TOKEN: BUCKETS_LATENCY,
    THINKING: BUCKETS_LATENCY,
    PHASE_DURATION: BUCKETS_LATENCY,
    PROXY_OVERHEAD: BUCKETS_OVERHEAD,
}
_ERROR_TYPES = frozenset(ERROR_TYPES)
QUEUE_LIMIT = 100_000  # records waiting for the worker; beyond this they are dropped (and counted)
POLL_SECONDS = 0.1
PAUSE_EVERY = 16  # requests recorded before the worker gives the GIL up (see telemetry/otlp.py)
SETS_KEPT = 4096  # kinds of request whose attribute sets are kept made; past this they are made afresh

# What decides every attribute set a request records under: api, operation, provider, upstream,
# request and response model labels, error.type.
_Kind = tuple[str, str, str, str, "str | None", "str | None", str]


@dataclass(frozen=True, slots=True)
class _Sets:
    """The attribute sets of one kind of request (`_Kind`), made once: one lookup per record."""

    failed: AttributeSet  # base, and error.type when it failed: the duration's
    base: AttributeSet  # the chunk metrics'
    tokens: tuple[AttributeSet, AttributeSet]  # base with gen_ai.token.type input, output
    ours: AttributeSet  # base with taotrace.api: our first-token TTFT's
    phases: tuple[AttributeSet, AttributeSet, AttributeSet]  # ours with taotrace.phase network, prefill_wait, decode


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive whole number of milliseconds from `env`, in seconds; `default` when absent or wrong."""
    value = env.get(name, "").strip()
    return int(value) / 1000 if value.isdigit() and int(value) > 0 else default


def build_meter_provider(env: Mapping[str, str] | None = None) -> MetricPipeline | None:
    """A pipeline exporting every `OTEL_METRIC_EXPORT_INTERVAL` ms; None when export is not
    configured or `OTEL_SDK_DISABLED=true`. `env` chooses the exporters, the OTLP endpoint and
    protocol, the interval, timeout and temporality; the resource (the spans' own,
    `tracing.resource_from_env`) and the exporters' other settings (headers, compression,
    certificates) are the SDK's, read from the process environment."""
    env = os.environ if env is None else env
    if sdk_disabled(env):
        return None
    exporters = exporters_from_env(env)
    if not exporters:
        return None
    return MetricPipeline(
        resource_from_env(env),
        exporters,
        interval=_seconds(env, "OTEL_METRIC_EXPORT_INTERVAL", DEFAULT_INTERVAL),
        timeout=_seconds(env, "OTEL_METRIC_EXPORT_TIMEOUT", DEFAULT_TIMEOUT),
        temporality=temporality_from_env(env),
    )


def shutdown_meter_provider(provider: MetricPipeline, timeout: float = 3.0) -> bool:
    """Export what is left, but never wait more than `timeout` for a dead collector."""
    if provider.shutdown(timeout):
        return True
    log.warning("metrics export did not finish within %.1fs; the last interval is lost", timeout)
    return False


class GenAIMetrics:
    """An observer: queues each finished record; a worker thread records it into the histograms."""

    def __init__(
        self,
        provider: MetricPipeline,
        *,
        server_address: str,
        server_port: int,
        models: ModelLabels,
        response_models: ModelLabels | None = None,
        queue_limit: int = QUEUE_LIMIT,
        upstreams: Mapping[str, tuple[str, int]] | None = None,
        conventions: Conventions | None = None,
        sets_kept: int = SETS_KEPT,
        yield_gil: bool = True,
    ) -> None:
        """`server_address`/`server_port`: the upstream; `upstreams`: each route's (host, port) by
        its name (`--route`), which wins for a record of that route; `conventions`: which client
        metric names to record (default: the released ones); `sets_kept`: kinds of request whose
        attribute sets are kept made; `yield_gil`: give the GIL up every `PAUSE_EVERY` requests
        recorded (for a loop that relays streams; not in a group's supervisor)."""
        conventions = conventions or Conventions()
        # One meter per convention version: a scope has one schema URL. Ours (taotrace.*) go on the first.
        self.sets = [_ClientMetrics(provider, names) for names in conventions.metrics]
        meter = self.sets[0].meter
        self.ttft = meter.histogram(
            TIME_TO_FIRST_TOKEN,
            "s",
            "Request head arrival to the first token event (streams only).",
            BUCKETS[TIME_TO_FIRST_TOKEN],
        )
        self.ttfat = meter.histogram(
            TIME_TO_FIRST_ANSWER_TOKEN,
            "s",
            "Request head arrival to the answer's first token, after any streamed reasoning (streams only).",
            BUCKETS[TIME_TO_FIRST_ANSWER_TOKEN],
        )
        self.thinking = meter.histogram(
            THINKING,
            "s",
            "Streamed reasoning before the answer: the first (reasoning) token to the answer's first token. "
            "Measured only; never hidden reasoning's estimate.",
            BUCKETS[THINKING],
        )
        self.phase = meter.histogram(
            PHASE_DURATION,
            "s",
            "Time in each phase (taotrace.phase): network, prefill_wait, decode.",
            BUCKETS[PHASE_DURATION],
        )
        self.overhead = meter.histogram(
            PROXY_OVERHEAD,
            "s",
            "The proxy's own time (taotrace.stage): request, head arrival to upstream write minus "
            "pool wait, DNS and connect; relay, per upstream read to the client socket.",
            BUCKETS[PROXY_OVERHEAD],
        )
        self._stages: dict[str, tuple[AttributeSet, AttributeSet]] = {}
        self._sets: dict[_Kind, _Sets] = {}
        self._sets_kept = sets_kept
        self.server: dict[str, str | int] = {"server.address": server_address, "server.port": server_port}
        self.servers: dict[str, dict[str, str | int]] = {
            name: {"server.address": host, "server.port": port, "taotrace.upstream": name}
            for name, (host, port) in (upstreams or {}).items()
        }
        # The request model: the very labels /metrics uses (same instance; Metrics.record has
        # already decided each name on the loop, so this thread only reads it). Response models are
        # bounded apart (this thread alone uses them), so dated variants never use up /metrics' budget.
        self.models = models
        self.response_models = response_models or ModelLabels(models.allowlist, models.limit)
        self.queue_limit = queue_limit
        self.yield_gil = yield_gil
        self.dropped = 0
        self._queue: deque[RequestRecord] = deque()
        self._drain_lock = threading.Lock()
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._run, name="taotrace-genai-metrics", daemon=True)
        self._worker.start()

    def __call__(self, rec: RequestRecord) -> None:
        """On the event loop: one append."""
        if len(self._queue) >= self.queue_limit:
            self.dropped += 1
            return
        self._queue.append(rec)

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self.drain()
        self.drain()

    def drain(self) -> None:
        """Record every queued request (the worker does this every 0.1 s)."""
        with self._drain_lock:
            queue = self._queue
            recorded = 0
            while queue:
                try:
                    self._record(queue.popleft())
                except Exception:  # one odd record must not stop the worker
                    log.exception("could not record GenAI metrics for one request")
                recorded += 1
                if self.yield_gil and recorded % PAUSE_EVERY == 0:
                    time.sleep(0)  # let the event loop have the GIL between requests

    def stop(self, timeout: float = 2.0) -> None:
        """Record what is queued and end the worker (the pipeline is the caller's to shut down)."""
        self._stop.set()
        self._worker.join(timeout)
        if self.dropped:
            log.warning("GenAI metrics: %d requests dropped (the recording queue was full)", self.dropped)

    def _record(self, rec: RequestRecord) -> None:
        """Record one request."""
        if rec.mirror:
            return  # a --mirror copy: no client asked for it (taotrace_compare_* compares it on /metrics)
        t = rec.timing
        stages = self._stages.get(rec.api)
        if stages is None:
            stages = self._stages[rec.api] = (
                AttributeSet.of({"taotrace.api": rec.api, "taotrace.stage": "request"}),
                AttributeSet.of({"taotrace.api": rec.api, "taotrace.stage": "relay"}),
            )
        self.overhead.record_many_set(t.relay, stages[1])
        if t.overhead_request is not None:
            self.overhead.record_set(t.overhead_request, stages[0])
        if rec.operation is None:
            return  # not a GenAI operation (`other`): only the proxy's own cost
        error = "" if not rec.error_type else rec.error_type if rec.error_type in _ERROR_TYPES else "_OTHER"
        kind: _Kind = (
            rec.api, rec.operation, rec.provider or "openai", rec.upstream,
            self.models(rec.model) if rec.model else None,
            self.response_models(rec.response_model) if rec.response_model else None,
            error,
        )  # fmt: skip
        sets = self._sets.get(kind)
        if sets is None:
            sets = self._made(kind)
        # The spec: billable counts as reported; never estimated. A counted stream's output is a
        # count, not billed usage; its input, when the upstream reported it first (Anthropic), is.
        u: Usage | None = rec.usage
        if rec.usage_source != "reported":
            given = rec.usage.input_tokens
            u = Usage(input_tokens=given) if given is not None else None
        for client in self.sets:
            client.record(rec, sets, u)
        if t.network is not None:
            self.phase.record_set(t.network, sets.phases[0])
        if not rec.stream:
            return
        if t.ttft is not None:
            self.ttft.record_set(t.ttft, sets.ours)
            if t.time_to_first_answer_token is not None:
                self.ttfat.record_set(t.time_to_first_answer_token, sets.ours)
            if t.thinking is not None:
                self.thinking.record_set(t.thinking, sets.ours)
            if t.prefill_wait is not None:
                self.phase.record_set(t.prefill_wait, sets.phases[1])
            if t.decode is not None:
                self.phase.record_set(t.decode, sets.phases[2])

    def _made(self, kind: _Kind) -> _Sets:
        """The attribute sets of a kind of request seen for the first time (or since the cache was full)."""
        api, operation, provider, upstream, model, response_model, error = kind
        base: dict[str, str | int] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": provider,
            **self.servers.get(upstream, self.server),
        }
        if model is not None:
            base["gen_ai.request.model"] = model
        if response_model is not None:
            base["gen_ai.response.model"] = response_model
        ours = {**base, "taotrace.api": api}
        sets = _Sets(
            failed=AttributeSet.of({**base, "error.type": error} if error else base),
            base=AttributeSet.of(base),
            tokens=(
                AttributeSet.of({**base, "gen_ai.token.type": "input"}),
                AttributeSet.of({**base, "gen_ai.token.type": "output"}),
            ),
            ours=AttributeSet.of(ours),
            phases=(
                AttributeSet.of({**ours, "taotrace.phase": "network"}),
                AttributeSet.of({**ours, "taotrace.phase": "prefill_wait"}),
                AttributeSet.of({**ours, "taotrace.phase": "decode"}),
            ),
        )
        if len(self._sets) >= self._sets_kept:  # bounded: the labels are, but their product need not be small
            self._sets.clear()
        self._sets[kind] = sets
        return sets


class _ClientMetrics:
    """The GenAI client metrics of one convention version, on a meter with its schema URL."""

    def __init__(self, provider: MetricPipeline, names: MetricNames) -> None:
        self.meter = meter = provider.get_meter("taotrace", __version__, names.schema_url)
        seconds = BUCKETS_SPEC_SECONDS
        self.duration = meter.histogram(names.duration, "s", "GenAI operation duration.", seconds)
        self.tokens: HistogramInstrument | None = None
        self.token_counter: CounterInstrument | None = None
        if names.tokens_counter:
            self.token_counter = meter.counter(names.tokens, "{token}", "Number of input and output tokens used.")
        else:
            self.tokens = meter.histogram(
                names.tokens, "{token}", "Number of input and output tokens used.", BUCKETS_SPEC_TOKENS
            )
        self.ttfc = meter.histogram(
            names.time_to_first_chunk,
            "s",
            "Time to receive the first chunk, measured from when the client issues the generation "
            "request to when the first chunk is received in the response stream.",
            seconds,
        )
        self.tpoc = meter.histogram(
            names.time_per_output_chunk,
            "s",
            "Time per output chunk, recorded for each chunk received after the first one, measured as "
            "the time elapsed from the end of the previous chunk to the end of the current chunk.",
            seconds,
        )

    def record(self, rec: RequestRecord, sets: _Sets, usage: Usage | None) -> None:
        """One request: duration (with error.type), reported tokens, and a stream's chunks."""
        t = rec.timing
        self.duration.record_set(t.duration, sets.failed)
        if usage is not None:
            for count, attributes in zip((usage.input_tokens, usage.output_tokens), sets.tokens, strict=True):
                if count is None:
                    continue
                if self.tokens is not None:
                    self.tokens.record_set(count, attributes)
                elif self.token_counter is not None:
                    self.token_counter.add_set(count, attributes)
        if rec.stream:
            if t.ttfc is not None:
                self.ttfc.record_set(t.ttfc, sets.base)
            self.tpoc.record_many_set(t.chunk_gaps, sets.base)
