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

from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from proxy import __version__
from proxy.dialects import RequestInfo
from proxy.timing import RequestRecord

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
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=traces_endpoint or endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    # Per the spec, the generic endpoint gets the signal path appended; the traces one is used as is.
    return HttpExporter(endpoint=traces_endpoint or f"{(endpoint or '').rstrip('/')}/v1/traces")


def build_tracer_provider(env: Mapping[str, str] | None = None) -> TracerProvider:
    """A provider honouring the SDK's own variables (service name, sampler, BSP limits, OTLP)."""
    env = os.environ if env is None else env
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", "taotrace"), "service.version": __version__})
    provider = TracerProvider(resource=resource)
    exporter = _exporter_from_env(env)
    if exporter is not None:
        # The batch processor drops spans when its queue is full instead of blocking: requests first.
        limits = {
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


class Telemetry:
    """Starts and ends the spans of each request on a tracer from the given provider."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider,
        *,
        upstream_host: str,
        upstream_port: int,
        upstream_base: str,
        capture_content: bool = False,
    ) -> None:
        self.tracer = tracer_provider.get_tracer("taotrace", __version__)
        self.server_address = upstream_host
        self.server_port = upstream_port
        self.upstream_base = upstream_base
        self.capture_content = capture_content
        # perf_counter seconds -> epoch nanoseconds, fixed at start (spans need wall time).
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def _ns(self, t: float) -> int:
        return int(t * 1e9) + self._offset_ns

    def start(self, info: RequestInfo, method: str, path: str, query: str, carrier: Mapping[str, str], t0: float) -> Span:
        """The root span, continuing the client's `traceparent` when it sent one."""
        if info.operation is None:
            name = method
        else:
            name = f"{info.operation} {info.model}" if info.model else info.operation
        attributes: dict[str, object] = {
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
        if self.capture_content and info.content is not None:
            attributes["gen_ai.input.messages"] = info.content[:65536]
        return self.tracer.start_span(
            name, context=extract(carrier), kind=SpanKind.CLIENT, attributes=attributes, start_time=self._ns(t0)
        )

    @staticmethod
    def inject(span: Span, headers: MutableMapping[str, str]) -> None:
        """Put our span's context in the upstream headers, replacing the client's `traceparent`."""
        inject(headers, context=trace.set_span_in_context(span))

    @staticmethod
    def trace_id(span: Span) -> str | None:
        ctx = span.get_span_context()
        return format(ctx.trace_id, "032x") if ctx.is_valid and ctx.trace_flags.sampled else None

    def finish(self, span: Span, rec: RequestRecord, output_text: str | None = None) -> None:
        """Attributes from the record, the three phase children, then end the root span."""
        if not span.is_recording():
            span.end(end_time=self._ns(rec.timing.end))
            return
        t = rec.timing
        u = rec.usage
        attrs: dict[str, object] = {"http.response.status_code": rec.status_code, "taotrace.duration": t.duration}
        optional: dict[str, object | None] = {
            "gen_ai.response.model": rec.response_model,
            "gen_ai.response.id": rec.response_id,
            "gen_ai.usage.input_tokens": u.input_tokens,
            "gen_ai.usage.output_tokens": u.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": u.cached_input_tokens,
            "gen_ai.usage.reasoning.output_tokens": u.reasoning_tokens,
            "gen_ai.response.time_to_first_chunk": t.ttft,
            "taotrace.ttfb": t.ttfb,
            "taotrace.time_to_headers": t.time_to_headers,
            "taotrace.tpot": t.tpot,
            "taotrace.connection.reused": t.connection_reused,
        }
        attrs.update({k: v for k, v in optional.items() if v is not None})
        if rec.finish_reasons:
            attrs["gen_ai.response.finish_reasons"] = list(rec.finish_reasons)
        if rec.stream:
            attrs["taotrace.usage_source"] = rec.usage_source
            attrs["taotrace.token_events"] = t.token_events
        if output_text is not None and self.capture_content:
            attrs["gen_ai.output.messages"] = output_text[:65536]
        if rec.error_type:
            attrs["error.type"] = rec.error_type
            span.set_status(Status(StatusCode.ERROR, rec.error_type))
        span.set_attributes(attrs)  # type: ignore[arg-type]
        self._children(span, rec)
        span.end(end_time=self._ns(t.end))

    def _children(self, parent: Span, rec: RequestRecord) -> None:
        t = rec.timing
        ctx = trace.set_span_in_context(parent)
        phases: list[tuple[str, float, float | None, dict[str, object]]] = []
        net_attrs = {
            k: v
            for k, v in (
                ("taotrace.connection.reused", t.connection_reused),
                ("taotrace.pool_wait", t.pool_wait),
                ("taotrace.dns", t.dns),
                ("taotrace.connect", t.connect),
            )
            if v is not None
        }
        phases.append(("network", t.start, t.sent if t.sent is not None else t.end, net_attrs))
        if t.sent is not None and t.first_token is not None:
            phases.append(("prefill_wait", t.sent, t.first_token, {}))
            phases.append(("decode", t.first_token, t.last_token, {"taotrace.token_events": t.token_events}))
        for name, start, end, attrs in phases:
            child = self.tracer.start_span(name, context=ctx, kind=SpanKind.INTERNAL, start_time=self._ns(start))
            if attrs:
                child.set_attributes(attrs)  # type: ignore[arg-type]
            if rec.error_type and name == "network" and t.sent is None:
                child.set_status(Status(StatusCode.ERROR, rec.error_type))
            child.end(end_time=self._ns(end if end is not None else start))
