"""Ship mode (`--workers N`, `--telemetry-process`): a serving process starts the span, another
finishes and exports it from the record; what leaves equals what one process exports.

Each scenario and sampler of tests/test_telemetry_fast.py runs both ways: one process
(`start`, `inject`, `finish`), and a "worker" Telemetry (no exporter) whose record, with its span's
start, crosses a pickle to a "supervisor" Telemetry that `replay`s it. Headers sent upstream and
every exported span must be equal, field by field, except the phase children's own span ids
(each process draws its own) and the resource, which the supervisor gives each worker.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from proxy.telemetry.spans import Telemetry, build_tracer_provider
from tests.test_telemetry_fast import (
    CLIENT_SPAN,
    INFO,
    OFFSET,
    SAMPLERS,
    SCENARIOS,
    T0,
    Collect,
    CountingIds,
    make,
    run,
    snapshot,
)

WORKER_OFFSET = OFFSET + 12_345  # the worker's clock offset differs from the supervisor's


def shipped(
    sampler: Any, rec: Any, src: Any, query: str, resource: Resource, parent: str = "child"
) -> tuple[list[ReadableSpan], Any]:
    from multidict import CIMultiDict

    worker_provider = (
        TracerProvider(sampler=sampler, id_generator=CountingIds())
        if sampler
        else TracerProvider(id_generator=CountingIds())
    )
    worker = Telemetry(
        worker_provider, upstream_host="api.example", upstream_port=443, upstream_base="https://api.example",
        capture_content=True, ship=True, parent=parent,
    )  # fmt: skip
    worker._offset_ns = WORKER_OFFSET
    headers = CIMultiDict(src)
    span = worker.start(INFO, "POST", "/v1/chat/completions", query, src, T0)
    worker.inject(span, headers)
    rec = dataclasses.replace(rec, span=worker.span_start(span, rec.sampling, "tok0 tok1"))
    worker.finish(span, rec, "tok0 tok1")
    rec = pickle.loads(pickle.dumps(rec, protocol=pickle.HIGHEST_PROTOCOL))  # as the channel carries it

    provider, exporter, supervisor = make(sampler, capture_content=True, parent=parent)
    supervisor.replay(rec, resource)
    provider.force_flush()
    provider.shutdown()
    return exporter.spans, list(headers.items())


def masked(span: ReadableSpan) -> tuple[Any, ...]:
    """The snapshot without what each process draws or sets for itself."""
    snap = list(snapshot(span))
    if span.kind.name != "CLIENT":
        snap[1] = snap[1][:1] + snap[1][2:]  # a child's own span id
    snap[9] = None  # resource
    return tuple(snap)


# --parent link and none change only what a caller's traceparent does
PARENTED = [
    (name, parent)
    for name, (_rec, src, _query) in SCENARIOS.items()
    for parent in ("child", "link", "none")
    if parent == "child" or "traceparent" in src
]


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("scenario,parent", PARENTED)
def test_shipped_spans_equal_one_process_spans(scenario: str, parent: str, sampler: str) -> None:
    """... in every `--parent` mode: the link to the caller's span crosses too."""
    rec, src, query = SCENARIOS[scenario]
    provider, exporter, tel = make(SAMPLERS[sampler], capture_content=True, parent=parent)
    tel._offset_ns = WORKER_OFFSET  # the times are the worker's: same clock, same offset
    one_headers = run(tel, rec, src, query)
    provider.force_flush()
    provider.shutdown()
    resource = Resource({"service.name": "taotrace", "service.instance.id": "w-0"})
    spans, headers = shipped(SAMPLERS[sampler], rec, src, query, resource, parent)
    assert headers == list(one_headers.items())
    if parent == "link" and spans:
        (root,) = [s for s in spans if s.kind.name == "CLIENT"]
        assert root.parent is None and [format(link.context.span_id, "016x") for link in root.links] == [CLIENT_SPAN]
    roots = {s.context.span_id for s in exporter.spans if s.kind.name == "CLIENT"}
    assert [masked(s) for s in spans] == [masked(s) for s in exporter.spans]
    # A custom sampler that adds attributes sends the children through the SDK's tracer, whose
    # resource is the supervisor's (no worker instance id): documented, and rare.
    general = sampler == "tagging"
    assert all(
        dict(s.resource.attributes).get("service.instance.id") == "w-0"
        for s in spans
        if not general or s.kind.name == "CLIENT"
    )
    # children point at the shipped root
    for s in spans:
        if s.kind.name != "CLIENT":
            assert s.parent is not None and s.parent.span_id in roots


def test_nothing_is_shipped_when_the_trace_is_not_exported() -> None:
    rec, src, query = SCENARIOS["stream"]
    worker = Telemetry(TracerProvider(), upstream_host="h", upstream_port=1, upstream_base="http://h", ship=True)
    span = worker.start(INFO, "POST", "/v1/chat/completions", query, src, T0)
    assert worker.span_start(span, "dropped", None) is None  # outcome sampling dropped it
    assert worker.span_start(span, "", None) is not None
    unsampled = Telemetry(
        TracerProvider(sampler=SAMPLERS["always_off"]), upstream_host="h", upstream_port=1,
        upstream_base="http://h", ship=True,
    )  # fmt: skip
    assert unsampled.span_start(unsampled.start(INFO, "POST", "/", "", src, T0), "", None) is None
    one_process = Telemetry(TracerProvider(), upstream_host="h", upstream_port=1, upstream_base="http://h")
    assert one_process.span_start(one_process.start(INFO, "POST", "/", "", src, T0), "", None) is None


def test_a_worker_provider_has_no_exporter() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert build_tracer_provider(env, export=False)._active_span_processor._span_processors == ()  # type: ignore[attr-defined]
    assert len(build_tracer_provider(env)._active_span_processor._span_processors) == 1  # type: ignore[attr-defined]


def test_replay_without_an_exporter_or_a_start_does_nothing() -> None:
    rec, _src, _query = SCENARIOS["stream"]
    collect = Collect()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(collect))
    tel = Telemetry(provider, upstream_host="h", upstream_port=1, upstream_base="http://h")
    tel.replay(rec)  # no span start in the record
    assert collect.spans == []
