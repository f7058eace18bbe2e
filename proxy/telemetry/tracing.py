"""Where the proxy's spans come from and where they go, from the standard `OTEL_*` variables.

`Tracing` bundles what `spans.Telemetry` needs: the resource (`OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`), the head sampler (`OTEL_TRACES_SAMPLER`), the id generator, and the
span processor (`OTEL_TRACES_EXPORTER` and `OTEL_EXPORTER_OTLP_*` through our own OTLP exporter,
batched per `OTEL_BSP_*`), or none when spans are not exported.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from proxy import __version__
from proxy.telemetry.batch_processor import BatchSpanProcessor
from proxy.telemetry.otlp import release_gil
from proxy.telemetry.otlp_env import export_settings, resource_attributes, traces_exporter
from proxy.telemetry.sampler import DEFAULT, Sampler, sampler_from_env
from proxy.telemetry.span_exporter import OtlpSpanExporter
from proxy.telemetry.span_pipeline import ConsoleSpanExporter
from proxy.telemetry.spandata import Resource, SpanExporter, SpanProcessor

__all__ = [
    "IdGenerator",
    "RandomIds",
    "SpanLimits",
    "Tracing",
    "build_tracing",
    "limits_from_env",
    "resource_from_env",
    "shutdown_tracing",
]

log = logging.getLogger("taotrace")


class IdGenerator(Protocol):
    def generate_trace_id(self) -> int: ...

    def generate_span_id(self) -> int: ...


class RandomIds:
    """Random, non-zero ids (W3C Trace Context level 2: the trace id's right 7 bytes are random)."""

    random_trace_id = True  # roots we start carry the W3C `random` trace flag

    def __init__(self, rng: random.Random | None = None) -> None:
        # The random module's own generator by default: CPython reseeds it in a forked child, so
        # a parent and its child never draw the same ids (a private Random would repeat them).
        self._bits = rng.getrandbits if rng is not None else random.getrandbits

    def generate_trace_id(self) -> int:
        trace_id = self._bits(128)
        while not trace_id:
            trace_id = self._bits(128)
        return trace_id

    def generate_span_id(self) -> int:
        span_id = self._bits(64)
        while not span_id:
            span_id = self._bits(64)
        return span_id


def resource_from_env(env: Mapping[str, str]) -> Resource:
    """The resource every span carries (the metrics' is the same: `otlp_env.resource_attributes`)."""
    return Resource(resource_attributes(env, __version__))


@dataclass(frozen=True)
class SpanLimits:
    """The attribute limits the specification's variables set: at most `count` attributes per span
    (the latest kept, as the SDK keeps them), string values cut to `length` characters."""

    count: int = 128
    length: int | None = None


def _limit(env: Mapping[str, str], names: tuple[str, str]) -> int | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            if value.isdigit():
                return int(value)
            log.warning("%s is not a non-negative integer; ignored", name)
    return None


def limits_from_env(env: Mapping[str, str]) -> SpanLimits:
    """`OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT` / `OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`, falling back
    to the general `OTEL_ATTRIBUTE_*` ones."""
    count = _limit(env, ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT"))
    length = _limit(env, ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"))
    return SpanLimits(128 if count is None else count, length)


@dataclass(frozen=True)
class Tracing:
    """The span side of telemetry. `processor` None: spans are started (ids and sampling, for the
    upstream's `traceparent`) but never exported."""

    processor: SpanProcessor | None = None
    sampler: Sampler = DEFAULT
    resource: Resource = field(default_factory=lambda: resource_from_env({}))
    ids: IdGenerator = field(default_factory=RandomIds)
    limits: SpanLimits = SpanLimits()


def _exporter(env: Mapping[str, str], pause: Callable[[], None] | None) -> SpanExporter | None:
    kind = traces_exporter(env)
    if kind == "console":
        return ConsoleSpanExporter()
    if kind != "otlp":
        return None
    settings = export_settings(env, "traces")
    return None if settings is None else OtlpSpanExporter(settings, pause=pause)


def build_tracing(
    env: Mapping[str, str] | None = None,
    *,
    export: bool = True,
    on_drop: Callable[[str, int], None] | None = None,
    serving: bool = True,
) -> Tracing:
    """Tracing as the standard variables ask. `export=False`: ids and sampling only (a serving
    process whose spans the telemetry process exports). `on_drop(reason, n)`: spans lost.
    `serving=False`: no event loop here relays streams (a group's supervisor), so the export
    thread keeps the GIL for a whole batch instead of giving it back every few spans (which
    starved it behind a busy loop: spans dropped from a full queue)."""
    env = os.environ if env is None else env
    pause = release_gil if serving else None
    exporter = _exporter(env, pause) if export else None
    processor: SpanProcessor | None = None
    if exporter is not None:
        # Batched on a thread (the console's too: printing never runs on the event loop); a full
        # queue drops (and counts) rather than blocking a request.
        processor = BatchSpanProcessor.from_env(exporter, env, on_drop, pause)
    return Tracing(
        processor=processor, sampler=sampler_from_env(env), resource=resource_from_env(env), limits=limits_from_env(env)
    )


def shutdown_tracing(tracing: Tracing, timeout: float = 3.0) -> bool:
    """Flush and stop the processor, never waiting past `timeout` for a dead collector."""
    if tracing.processor is None:
        return True
    done = tracing.processor.shutdown(timeout)
    if not done:
        log.warning("trace export did not finish within %.1fs; unsent spans dropped", timeout)
    return done
