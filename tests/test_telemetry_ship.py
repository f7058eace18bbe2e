"""Ship mode (`--workers N`, `--telemetry-process`): a serving process starts the span, another
finishes and exports it from the record; what leaves equals what one process exports.

Each scenario and sampler of tests/test_span_equivalence.py runs both ways: one process
(`start`, `inject`, `finish`), and a "worker" `Spans` (no exporter) whose record, with its span's
start, crosses the workers' channel (encoded as it sends records) to a "supervisor" `Spans`
that `replay`s it. Headers sent upstream and every exported span must be equal, field by field,
except the phase children's own span ids (each process draws its own) and the resource, which
the supervisor gives each worker.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from proxy.telemetry.span_pipeline import InMemorySpanExporter, SimpleSpanProcessor
from proxy.telemetry.spandata import Resource, SpanData
from proxy.telemetry.spans import Spans
from proxy.telemetry.tracing import Tracing, build_tracing
from proxy.workers import channel
from proxy.workers.messages import Records
from tests.test_span_equivalence import (
    CLIENT_SPAN,
    INFO,
    OFFSET,
    SAMPLERS,
    SCENARIOS,
    T0,
    CountingIds,
    make,
    run,
    snapshot,
)

WORKER_OFFSET = OFFSET + 12_345  # the worker's clock offset differs from the supervisor's


def shipped(
    sampler: str, rec: Any, src: Any, query: str, resource: Resource, parent: str = "child"
) -> tuple[tuple[SpanData, ...], Any]:
    from multidict import CIMultiDict

    worker = Spans(
        Tracing(sampler=SAMPLERS[sampler][0], ids=CountingIds()), upstream_host="api.example", upstream_port=443, upstream_base="https://api.example",
        capture_content=True, ship=True, parent=parent,
    )  # fmt: skip
    worker._offset_ns = WORKER_OFFSET
    headers = CIMultiDict(src)
    span = worker.start(INFO, "POST", "/v1/chat/completions", query, src, T0)
    worker.inject(span, headers)
    rec = dataclasses.replace(rec, span=worker.span_start(span, rec.sampling, "tok0 tok1"))
    frame = channel.encode(Records([rec], {}, 0, {}))  # as the channel carries it
    crossed = channel.decode_frame(frame)
    assert isinstance(crossed, Records)
    (rec,) = crossed.records

    exporter, supervisor = make(sampler, capture_content=True, parent=parent)
    supervisor.end(rec, resource)
    return exporter.get_finished_spans(), list(headers.items())


def masked(span: SpanData) -> tuple[Any, ...]:
    """The snapshot without what each process draws or sets for itself."""
    snap = list(snapshot(span))
    if span.kind.name != "CLIENT":
        snap[1] = snap[1][:1] + snap[1][2:]  # a child's own span id
        if span.name == "thinking":  # inside a phase (a reasoning model's): its parent's is a child's too
            snap[2] = snap[2][:1] + snap[2][2:]
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
    exporter, tel = make(sampler, capture_content=True, parent=parent)
    tel._offset_ns = WORKER_OFFSET  # the times are the worker's: same clock, same offset
    one_headers = run(tel, rec, src, query)
    one = exporter.get_finished_spans()
    resource = Resource({"service.name": "taotrace", "service.instance.id": "w-0"})
    spans, headers = shipped(sampler, rec, src, query, resource, parent)
    assert headers == list(one_headers.items())
    if parent == "link" and spans:
        (root,) = [s for s in spans if s.kind.name == "CLIENT"]
        assert root.parent is None and [format(link.context.span_id, "016x") for link in root.links] == [CLIENT_SPAN]
    roots = {s.context.span_id for s in one if s.kind.name == "CLIENT"}
    assert [masked(s) for s in spans] == [masked(s) for s in one]
    assert all(dict(s.resource.attributes).get("service.instance.id") == "w-0" for s in spans)
    # children point at the shipped root, or (a thinking span) at a phase shipped with it
    phases = {s.context.span_id: s.name for s in spans if s.kind.name != "CLIENT"}
    for s in spans:
        if s.kind.name != "CLIENT":
            assert s.parent is not None
            assert s.parent.span_id in roots or (s.name == "thinking" and phases.get(s.parent.span_id) in (
                "prefill_wait", "decode", None))  # None: the phase the sampler left out  # fmt: skip


def test_nothing_is_shipped_when_the_trace_is_not_exported() -> None:
    rec, src, query = SCENARIOS["stream"]
    worker = Spans(Tracing(), upstream_host="h", upstream_port=1, upstream_base="http://h", ship=True)
    span = worker.start(INFO, "POST", "/v1/chat/completions", query, src, T0)
    assert worker.span_start(span, "dropped", None) is None  # outcome sampling dropped it
    assert worker.span_start(span, "", None) is not None
    unsampled = Spans(
        Tracing(sampler=SAMPLERS["always_off"][0]), upstream_host="h", upstream_port=1,
        upstream_base="http://h", ship=True,
    )  # fmt: skip
    assert unsampled.span_start(unsampled.start(INFO, "POST", "/", "", src, T0), "", None) is None
    one_process = Spans(Tracing(), upstream_host="h", upstream_port=1, upstream_base="http://h")
    assert one_process.span_start(one_process.start(INFO, "POST", "/", "", src, T0), "", None) is None


def test_a_worker_provider_has_no_exporter() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert build_tracing(env, export=False).processor is None
    processor = build_tracing(env).processor
    assert processor is not None and processor.shutdown(1.0)


def test_replay_without_an_exporter_or_a_start_does_nothing() -> None:
    rec, _src, _query = SCENARIOS["stream"]
    collect = InMemorySpanExporter()
    tel = Spans(
        Tracing(processor=SimpleSpanProcessor(collect)), upstream_host="h", upstream_port=1, upstream_base="http://h"
    )
    tel.end(rec)  # no span start in the record
    assert collect.get_finished_spans() == ()
