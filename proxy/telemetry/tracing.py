"""Where the proxy's spans come from and where they go, from the standard `OTEL_*` variables.

`Tracing` bundles what `spans.Spans` needs: the resource (the SDK's `Resource.create()`:
`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPERIMENTAL_RESOURCE_DETECTORS`), the head
sampler (`OTEL_TRACES_SAMPLER`), the id generator, and the span processor: one batch processor
(`OTEL_BSP_*`) per exporter `OTEL_TRACES_EXPORTER` lists, as the SDK has. `otlp` is our own OTLP
exporter (`OTEL_EXPORTER_OTLP_*`); any other name is the OpenTelemetry exporter its entry point
names (`console` the SDK's, `zipkin`, ...), fed our spans through `span_pipeline.LibrarySpanExporter`.
`OTEL_SDK_DISABLED=true`: no span is started or exported.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Protocol

from opentelemetry.sdk.resources import Resource as SdkResource
from opentelemetry.sdk.trace.export import SpanExporter as LibraryExporter

from proxy import __version__
from proxy.telemetry.batch_processor import BatchSpanProcessor
from proxy.telemetry.otel_variables import TRACES_EXPORTERS
from proxy.telemetry.otlp import release_gil
from proxy.telemetry.otlp_env import OWN_OTLP, export_settings, exporter_names, sdk_disabled
from proxy.telemetry.sampler import DEFAULT, Sampler, sampler_from_env
from proxy.telemetry.span_exporter import OtlpSpanExporter
from proxy.telemetry.span_pipeline import FanOutSpanProcessor, LibrarySpanExporter
from proxy.telemetry.spandata import Resource, SpanExporter, SpanProcessor

__all__ = [
    "IdGenerator",
    "RandomIds",
    "SpanLimits",
    "Tracing",
    "TracingError",
    "build_tracing",
    "check_tracing",
    "limits_from_env",
    "resource_from_env",
    "sdk_disabled",
    "shutdown_tracing",
]

log = logging.getLogger("taotrace")

# The variables Resource.create() reads, from the process environment.
_RESOURCE_VARIABLES = ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS")
# What taotrace says of itself on every resource: the spans are built and encoded by its own
# pipeline (telemetry.sdk.*), and the release that did it.
_OURS: Mapping[str, str] = MappingProxyType(
    {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "taotrace",
        "telemetry.sdk.version": __version__,
        "service.version": __version__,
    }
)
# The process detector's command line: taotrace's may carry --ui-token, --key-salt or an
# upstream's password (the SDK's `process` detector records it in older releases, 1.28 among them).
_LEFT_OUT = frozenset({"process.command_line", "process.command_args"})


class TracingError(Exception):
    """What the `OTEL_*` variables ask for cannot be set up (an exporter that fails to load or
    start, a resource detector that fails): `serve` says it in one line and exits 2."""


def resource_from_env(env: Mapping[str, str]) -> SdkResource:
    """The resource of every span and metric, as the SDK's `Resource.create()` makes it, with
    taotrace's `service.version` and `telemetry.sdk.*`, and `service.name` `taotrace` when no
    variable names the service (the SDK would say `unknown_service`).

    The SDK reads the resource variables from the process environment: `env` must agree with it
    on them (a test sets them with monkeypatch), or this raises ValueError rather than ignore them.
    Raises TracingError when a detector fails to load (an unknown name, on older SDKs)."""
    for name in _RESOURCE_VARIABLES:
        if env.get(name) != os.environ.get(name):
            raise ValueError(f"{name} differs from the process environment's, which the SDK's Resource.create() reads")
    try:
        created = SdkResource.create(_OURS)
    except Exception as error:  # noqa: BLE001 - an older SDK (1.28) raises on a detector name it cannot find
        raise TracingError(
            f"OTEL_EXPERIMENTAL_RESOURCE_DETECTORS: a resource detector failed to load ({type(error).__name__})"
        ) from None
    attributes = {k: v for k, v in created.attributes.items() if k not in _LEFT_OUT}
    service = attributes.get("service.name")
    if not isinstance(service, str) or service == "unknown_service" or service.startswith("unknown_service:"):
        attributes["service.name"] = "taotrace"
    return SdkResource(attributes, created.schema_url)


def _own(resource: SdkResource) -> Resource:
    """The resource as our encoder reads it, converted once at start."""
    return Resource(dict(resource.attributes), resource.schema_url)


def _default_resource() -> Resource:
    """The resource of a `Tracing` made without the environment (tests, embedding code)."""
    return Resource({**_OURS, "service.name": "taotrace"})


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
    upstream's `traceparent`) but never exported. `disabled` (`OTEL_SDK_DISABLED=true`): no span
    is started either, and the caller's trace headers go upstream as they came."""

    processor: SpanProcessor | None = None
    sampler: Sampler = DEFAULT
    resource: Resource = field(default_factory=_default_resource)
    ids: IdGenerator = field(default_factory=RandomIds)
    limits: SpanLimits = SpanLimits()
    disabled: bool = False


def _library_exporter(name: str) -> LibraryExporter:
    """The exporter `name`'s entry point gives, made as the SDK makes it (no arguments: it reads
    its own variables). Raises TracingError when it is not installed, not an exporter, or fails."""
    found = [ep for ep in entry_points(group=TRACES_EXPORTERS) if ep.name == name]
    if not found:
        raise TracingError(
            f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides "
            f"(an entry point in {TRACES_EXPORTERS}): install its exporter, or leave it out"
        )
    try:
        cls = found[0].load()
        if not (isinstance(cls, type) and issubclass(cls, LibraryExporter)):
            raise TracingError(f"OTEL_TRACES_EXPORTER={name}: its entry point is not a span exporter")
        exporter: LibraryExporter = cls()
    except TracingError:
        raise
    except Exception as error:  # noqa: BLE001 - a plug-in's failure, said in one line
        raise TracingError(
            f"OTEL_TRACES_EXPORTER={name}: the exporter could not start ({type(error).__name__})"
        ) from None
    return exporter


def _exporters(env: Mapping[str, str], pause: Callable[[], None] | None) -> list[SpanExporter]:
    """One exporter per name `OTEL_TRACES_EXPORTER` lists (our OTLP one only with an endpoint).
    When one cannot be made, those made before it are shut down and TracingError says why."""
    exporters: list[SpanExporter] = []
    try:
        for name in exporter_names(env):
            if name not in OWN_OTLP:
                exporters.append(LibrarySpanExporter(_library_exporter(name)))
                continue
            settings = export_settings(env, "traces", OWN_OTLP[name])
            if settings is not None:
                exporters.append(OtlpSpanExporter(settings, pause=pause))
    except (ValueError, TracingError) as error:
        for made in exporters:
            made.shutdown()
        if isinstance(error, TracingError):
            raise
        raise TracingError(str(error)) from None  # a list or an OTLP setting we cannot honour
    return exporters


def build_tracing(
    env: Mapping[str, str] | None = None, *, on_drop: Callable[[str, int], None] | None = None
) -> Tracing:
    """Tracing as the standard variables ask. `on_drop(reason, n)`: spans lost. Raises
    TracingError when an exporter or the resource cannot be set up."""
    env = os.environ if env is None else env
    if sdk_disabled(env):
        return Tracing(disabled=True)
    resource = _own(resource_from_env(env))
    # Batched on a thread, one processor per exporter as the SDK has (the console's too:
    # printing never runs on the event loop); a full queue drops (and counts) rather than
    # blocking a request. The thread gives the GIL to the event loop every few spans encoded.
    processors = [BatchSpanProcessor.from_env(e, env, on_drop, release_gil) for e in _exporters(env, release_gil)]
    processor: SpanProcessor | None = None
    if len(processors) == 1:
        processor = processors[0]
    elif processors:
        processor = FanOutSpanProcessor(processors)
    return Tracing(processor=processor, sampler=sampler_from_env(env), resource=resource, limits=limits_from_env(env))


def check_tracing(env: Mapping[str, str]) -> Resource:
    """What `build_tracing` would make of `env`, made and let go (a group's supervisor, whose
    workers build their own): raises TracingError as it would. Its resource (the default one
    when `OTEL_SDK_DISABLED` is set)."""
    if sdk_disabled(env):
        return _default_resource()
    resource = _own(resource_from_env(env))
    for exporter in _exporters(env, None):
        exporter.shutdown()
    return resource


def shutdown_tracing(tracing: Tracing, timeout: float = 3.0) -> bool:
    """Flush and stop the processor, never waiting past `timeout` for a dead collector."""
    if tracing.processor is None:
        return True
    done = tracing.processor.shutdown(timeout)
    if not done:
        log.warning("trace export did not finish within %.1fs; unsent spans dropped", timeout)
    return done
