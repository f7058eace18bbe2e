"""The span pipeline's processors and exporters (proxy/telemetry/span_pipeline.py,
batch_processor.py), with exporters faked at the edge: classes implementing the protocol."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import socket
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export import SpanExporter as SdkSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter as SdkMemoryExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from proxy.telemetry.batch_processor import BatchSettings, BatchSpanProcessor, batch_settings
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.otlp_env import export_settings
from proxy.telemetry.span_exporter import OtlpSpanExporter
from proxy.telemetry.span_pipeline import (
    FanOutSpanProcessor,
    InMemorySpanExporter,
    LibrarySpanExporter,
    SimpleSpanProcessor,
)
from proxy.telemetry.spandata import Resource, Scope, SpanData
from tests.fakes import OTLPSink

RESOURCE = Resource({"service.name": "taotrace"}, "https://opentelemetry.io/schemas/1.37.0")
SCOPE = Scope("taotrace", "1.2.3")
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736


def span(i: int = 0, **kw: object) -> SpanData:
    args: dict[str, object] = {
        "name": "chat gpt-4o-mini",
        "context": SpanContext(TRACE_ID, 0x1000 + i, False, TraceFlags(1)),
        "parent": None,
        "kind": SpanKind.CLIENT,
        "start_time": 1_700_000_000_123_456_789,
        "end_time": 1_700_000_001_000_000_001,
        "attributes": {"n": i},
        "resource": RESOURCE,
        "instrumentation_scope": SCOPE,
    }
    args.update(kw)
    return SpanData(**args)  # type: ignore[arg-type]


class Raising:
    """An exporter whose every call raises."""

    def __init__(self) -> None:
        self.shut = 0

    def export(self, spans: Sequence[SpanData]) -> bool:
        raise RuntimeError("collector exploded")

    def shutdown(self) -> None:
        self.shut += 1


def test_in_memory_keeps_clears_and_refuses_after_shutdown() -> None:
    exporter = InMemorySpanExporter()
    a, b = span(1), span(2)
    assert exporter.export([a]) and exporter.export([b])
    assert exporter.get_finished_spans() == (a, b)
    exporter.clear()
    assert exporter.get_finished_spans() == ()
    exporter.shutdown()
    assert exporter.export([a]) is False and exporter.get_finished_spans() == ()


def test_simple_processor_exports_each_span_at_once_and_stops_at_shutdown() -> None:
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    s = span()
    processor.on_end(s)
    assert exporter.get_finished_spans() == (s,)
    assert processor.force_flush(1.0) and processor.shutdown(1.0)
    processor.on_end(span(2))
    assert exporter.get_finished_spans() == (s,)


def test_simple_processor_never_raises() -> None:
    exporter = Raising()
    processor = SimpleSpanProcessor(exporter)
    processor.on_end(span())  # the RuntimeError is contained
    assert processor.shutdown(1.0) and processor.shutdown(1.0)
    assert exporter.shut == 1


def console_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects the SDK's ConsoleSpanExporter printed (each indented, one after another)."""
    decoder, objects, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        obj, at = decoder.raw_decode(text, at)
        objects.append(obj)
    return objects


def test_the_sdks_console_exporter_prints_our_spans_through_the_adapter() -> None:
    """`OTEL_TRACES_EXPORTER=console` is the SDK's exporter: our spans reach it as `ReadableSpan`s."""
    out = io.StringIO()
    root = span(
        1,
        parent=SpanContext(TRACE_ID, 0xFEED, True, TraceFlags(1)),
        context=SpanContext(TRACE_ID, 0x1001, False, TraceFlags(1), TraceState([("ot", "th:8")])),
        attributes={"s": "é", "t": ("stop", "length"), "ok": True},
        status=Status(StatusCode.ERROR, "upstream_error"),
        links=(Link(SpanContext(0xAB, 7, True, TraceFlags(1)), {"k": 1}),),
    )
    child = span(2, name="decode", kind=SpanKind.INTERNAL, parent=root.context, attributes={})
    assert LibrarySpanExporter(ConsoleSpanExporter(out=out)).export([root, child])
    first, second = console_objects(out.getvalue())
    assert first["name"] == "chat gpt-4o-mini" and first["kind"] == "SpanKind.CLIENT"
    assert (first["context"]["trace_id"], first["context"]["span_id"], first["parent_id"]) == (
        f"0x{TRACE_ID:032x}", f"0x{0x1001:016x}", f"0x{0xFEED:016x}"
    )  # fmt: skip
    assert first["start_time"] == "2023-11-14T22:13:20.123457Z"  # the SDK prints microseconds
    assert first["attributes"] == {"s": "é", "t": ["stop", "length"], "ok": True}
    assert first["status"] == {"status_code": "ERROR", "description": "upstream_error"}
    assert first["links"][0]["context"]["trace_id"] == f"0x{0xAB:032x}" and first["links"][0]["attributes"] == {"k": 1}
    assert first["resource"] == {"attributes": {"service.name": "taotrace"}, "schema_url": RESOURCE.schema_url}
    assert (second["name"], second["kind"], second["parent_id"]) == ("decode", "SpanKind.INTERNAL", f"0x{0x1001:016x}")


def test_the_adapter_gives_sdk_exporters_every_field_of_our_spans() -> None:
    got = SdkMemoryExporter()
    ours = span(
        3,
        parent=SpanContext(TRACE_ID, 0xFEED, True, TraceFlags(1)),
        status=Status(StatusCode.ERROR, "timeout"),
        links=(Link(SpanContext(0xAB, 7, True, TraceFlags(1))),),
        dropped_attributes=4,
        instrumentation_scope=Scope("taotrace", "1.2.3", "https://opentelemetry.io/schemas/gen-ai/0.1.0"),
    )
    adapter = LibrarySpanExporter(got)
    assert adapter.export([ours, span(4)])
    first, second = got.get_finished_spans()
    assert (first.name, first.context, first.parent, first.kind) == (ours.name, ours.context, ours.parent, ours.kind)
    assert (first.start_time, first.end_time, first.status.status_code) == (
        ours.start_time,
        ours.end_time,
        StatusCode.ERROR,
    )
    assert dict(first.attributes or {}) == ours.attributes and first.dropped_attributes == 4
    assert [link.context for link in first.links] == [SpanContext(0xAB, 7, True, TraceFlags(1))]
    assert (dict(first.resource.attributes), first.resource.schema_url) == (
        dict(RESOURCE.attributes),
        RESOURCE.schema_url,
    )
    scope = first.instrumentation_scope
    assert scope is not None and (scope.name, scope.version, scope.schema_url) == (
        "taotrace", "1.2.3", "https://opentelemetry.io/schemas/gen-ai/0.1.0"
    )  # fmt: skip
    assert second.resource is first.resource  # converted once per resource
    assert second.dropped_attributes == 0


class SdkFailing(SdkSpanExporter):
    """An SDK exporter that fails: by its result, then by raising."""

    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.calls += 1
        if self.calls == 1:
            return SpanExportResult.FAILURE
        raise RuntimeError("zipkin exploded")

    def shutdown(self) -> None:
        raise RuntimeError("and again")


def test_a_failing_sdk_exporter_is_a_failed_export_never_a_raise(caplog: pytest.LogCaptureFixture) -> None:
    adapter = LibrarySpanExporter(SdkFailing())
    assert adapter.export([span()]) is False
    with caplog.at_level(logging.WARNING):
        assert adapter.export([span()]) is False
        adapter.shutdown()
    assert "span export through SdkFailing failed: RuntimeError" in caplog.text
    assert "zipkin exploded" not in caplog.text  # the type only: a plug-in's message may carry a URL


def test_fan_out_hands_each_span_to_every_processor_and_stops_them_all() -> None:
    a, b = InMemorySpanExporter(), InMemorySpanExporter()
    fan = FanOutSpanProcessor([SimpleSpanProcessor(a), SimpleSpanProcessor(b)])
    s = span()
    fan.on_end(s)
    assert a.get_finished_spans() == b.get_finished_spans() == (s,)
    assert fan.force_flush(1.0) and fan.shutdown(1.0)
    fan.on_end(span(2))
    assert a.get_finished_spans() == b.get_finished_spans() == (s,)


# -- the batch processor -------------------------------------------------------------------------


class Recording:
    """An exporter that keeps each batch; `result` is what export returns, `raises` how many calls
    raise first, and while `gate` is clear an export blocks (a collector that hangs)."""

    def __init__(self, result: bool = True, raises: int = 0) -> None:
        self.batches: list[list[SpanData]] = []
        self.result = result
        self.raises = raises
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set when an export starts
        self.exported = threading.Event()  # set when an export returns
        self.shut = threading.Event()

    def export(self, spans: Sequence[SpanData]) -> bool:
        self.entered.set()
        self.gate.wait()
        if self.raises:
            self.raises -= 1
            raise RuntimeError("exporter bug")
        self.batches.append(list(spans))
        self.exported.set()
        return self.result

    def shutdown(self) -> None:
        self.shut.set()


class Drops:
    """on_drop: the counts by reason."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, reason: str, count: int) -> None:
        self.counts[reason] += count


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_full_batch_is_exported_at_once_not_after_the_delay() -> None:
    exporter = Recording()
    processor = BatchSpanProcessor(exporter, schedule_delay=60, max_export_batch_size=4)
    began = time.monotonic()
    for i in range(4):
        processor.on_end(span(i))
    assert exporter.exported.wait(10)
    assert time.monotonic() - began < 10  # the delay is 60 s
    assert [[s.context.span_id for s in b] for b in exporter.batches] == [[0x1000, 0x1001, 0x1002, 0x1003]]
    assert processor.shutdown(10) and exporter.shut.is_set()


def test_the_schedule_delay_exports_a_partial_batch() -> None:
    exporter = Recording()
    processor = BatchSpanProcessor(exporter, schedule_delay=0.2, max_export_batch_size=100)
    for i in range(3):
        processor.on_end(span(i))
    assert exporter.exported.wait(10)
    assert [len(b) for b in exporter.batches] == [3]
    assert processor.shutdown(10)


def test_a_full_queue_drops_and_counts_each_span_without_waiting() -> None:
    exporter, drops = Recording(), Drops()
    exporter.gate.clear()  # the collector hangs
    processor = BatchSpanProcessor(
        exporter, max_queue_size=4, max_export_batch_size=2, schedule_delay=60, on_drop=drops
    )
    processor.on_end(span(0))
    processor.on_end(span(1))  # a full batch: the thread takes it and hangs in export
    assert exporter.entered.wait(10)
    began = time.monotonic()
    for i in range(2, 9):
        processor.on_end(span(i))  # 4 fit in the queue, 3 do not
    assert time.monotonic() - began < 1.0
    assert drops.counts == Counter(queue_full=3)
    exporter.gate.set()
    assert processor.shutdown(10)
    assert sorted(s.context.span_id - 0x1000 for b in exporter.batches for s in b) == [0, 1, 2, 3, 4, 5]
    assert drops.counts == Counter(queue_full=3)


def test_a_batch_the_exporter_fails_is_counted() -> None:
    exporter, drops = Recording(result=False), Drops()
    processor = BatchSpanProcessor(exporter, max_export_batch_size=2, schedule_delay=60, on_drop=drops)
    for i in range(5):
        processor.on_end(span(i))
    assert processor.force_flush(10)
    assert drops.counts == Counter(export_failed=5)
    assert processor.shutdown(10)


def test_an_exporter_that_raises_costs_its_batch_not_the_thread() -> None:
    exporter, drops = Recording(raises=1), Drops()
    processor = BatchSpanProcessor(exporter, max_export_batch_size=2, schedule_delay=60, on_drop=drops)
    processor.on_end(span(0))
    processor.on_end(span(1))
    assert wait_for(lambda: drops.counts["export_failed"] == 2)
    processor.on_end(span(2))
    processor.on_end(span(3))
    assert exporter.exported.wait(10)  # the thread lived on
    assert [[s.context.span_id - 0x1000 for s in b] for b in exporter.batches] == [[2, 3]]
    assert processor.shutdown(10)


def test_on_end_never_raises_even_when_counting_raises() -> None:
    def on_drop(reason: str, count: int) -> None:
        raise RuntimeError("registry gone")

    exporter = Recording()
    exporter.gate.clear()
    processor = BatchSpanProcessor(
        exporter, max_queue_size=1, max_export_batch_size=1, schedule_delay=60, on_drop=on_drop
    )
    processor.on_end(span(0))
    assert exporter.entered.wait(10)
    for i in range(1, 5):
        processor.on_end(span(i))  # one queued, three dropped: on_drop raises each time
    exporter.gate.set()
    assert processor.shutdown(10)


def test_flush_and_shutdown_with_a_hanging_exporter_return_false_within_their_timeout() -> None:
    exporter, drops = Recording(), Drops()
    exporter.gate.clear()
    processor = BatchSpanProcessor(exporter, schedule_delay=60, on_drop=drops)
    processor.on_end(span(0))
    began = time.monotonic()
    assert processor.force_flush(0.2) is False
    assert exporter.entered.is_set()
    assert processor.shutdown(0.2) is False
    assert time.monotonic() - began < 0.2 + 0.2 + 5  # the timeouts, plus a loaded machine's slack
    assert exporter.shut.wait(10)  # told to stop, from a thread of its own
    processor.on_end(span(1))  # after shutdown: ignored
    exporter.gate.set()
    assert wait_for(lambda: not processor._thread.is_alive())
    assert [len(b) for b in exporter.batches] == [1]


def test_shutdown_exports_what_is_queued_and_then_refuses_spans() -> None:
    exporter = Recording()
    processor = BatchSpanProcessor(exporter, schedule_delay=60, max_export_batch_size=512)
    for i in range(600):
        processor.on_end(span(i))
    assert processor.shutdown(10)
    assert sum(len(b) for b in exporter.batches) == 600 and max(len(b) for b in exporter.batches) <= 512
    assert exporter.shut.is_set()
    processor.on_end(span(1))
    assert processor.force_flush(1.0) and processor.shutdown(1.0)
    assert sum(len(b) for b in exporter.batches) == 600


def test_the_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        BatchSpanProcessor(Recording(), max_queue_size=0)


def test_bsp_variables_are_read_as_the_spec_says() -> None:
    env = {
        "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        "OTEL_BSP_SCHEDULE_DELAY": "250",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": " 10 ",
        "OTEL_BSP_EXPORT_TIMEOUT": "1500",
    }
    assert batch_settings(env) == BatchSettings(100, 0.25, 10, 1.5)
    assert batch_settings({}) == BatchSettings(2048, 5.0, 512, 30.0)
    processor = BatchSpanProcessor.from_env(Recording(), env, Drops())
    assert (processor.max_queue_size, processor.schedule_delay, processor.max_export_batch_size) == (100, 0.25, 10)
    assert processor.export_timeout == 1.5
    assert processor.shutdown(10)


@pytest.mark.parametrize("bad", ["abc", "-1", "0", "1.5", "1e3", "０x"])
def test_a_bad_bsp_value_is_the_default_and_one_warning_naming_the_variable(
    bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    names = [
        "OTEL_BSP_MAX_QUEUE_SIZE",
        "OTEL_BSP_SCHEDULE_DELAY",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        "OTEL_BSP_EXPORT_TIMEOUT",
    ]
    with caplog.at_level(logging.WARNING):
        assert batch_settings(dict.fromkeys(names, bad)) == BatchSettings()
    assert sorted(next(n for n in names if n in r.getMessage()) for r in caplog.records) == sorted(names)


def test_a_batch_larger_than_the_queue_is_the_queues_size(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        s = batch_settings({"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "200"})
    assert (s.max_queue_size, s.max_export_batch_size) == (100, 100)
    (record,) = caplog.records
    assert "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" in record.getMessage()
    with caplog.at_level(logging.WARNING):  # a small queue alone: the default batch shrinks, silently
        assert batch_settings({"OTEL_BSP_MAX_QUEUE_SIZE": "64"}).max_export_batch_size == 64
    assert len(caplog.records) == 1


def test_the_metrics_counter_starts_at_zero_and_is_an_on_drop() -> None:
    metrics = Metrics()
    page = metrics.registry.render().decode()
    assert 'taotrace_spans_dropped_total{reason="queue_full"} 0.0' in page
    assert 'taotrace_spans_dropped_total{reason="export_failed"} 0.0' in page
    processor = BatchSpanProcessor(
        Recording(result=False), max_export_batch_size=2, schedule_delay=60, on_drop=metrics.span_dropped
    )
    processor.on_end(span(0))
    processor.on_end(span(1))
    assert processor.shutdown(10)
    page = metrics.registry.render().decode()
    assert 'taotrace_spans_dropped_total{reason="export_failed"} 2.0' in page
    assert 'taotrace_spans_dropped_total{reason="queue_full"} 0.0' in page


# -- end to end: the batch processor, our OTLP exporter, a real receiver -------------------------


def otlp_exporter(endpoint: str, timeout: str = "10") -> OtlpSpanExporter:
    settings = export_settings(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": timeout}, "traces"
    )
    assert settings is not None
    return OtlpSpanExporter(settings)


def request_spans(n: int) -> list[SpanData]:
    """n requests: a root with a remote parent and a link, and its three phase children."""
    out = []
    for i in range(n):
        trace = SpanContext(TRACE_ID + i, 0x10, False, TraceFlags(1), TraceState([("ot", "th:8")]))
        out.append(
            span(
                i,
                context=trace,
                parent=SpanContext(TRACE_ID + i, 0xFEED, True, TraceFlags(1)),
                links=(Link(SpanContext(0xAB, 7, True, TraceFlags(1)), {"k": i}),),
            )
        )
        out += [
            span(i, name=name, kind=SpanKind.INTERNAL, parent=trace, attributes={},
                 context=SpanContext(TRACE_ID + i, 0x11 + k, False, TraceFlags(1)))
            for k, name in enumerate(("network", "prefill_wait", "decode"))
        ]  # fmt: skip
    return out


async def test_spans_reach_a_real_otlp_receiver() -> None:
    sink = await OTLPSink().start()
    drops = Drops()
    processor = BatchSpanProcessor(otlp_exporter(sink.url), schedule_delay=0.1, max_export_batch_size=16, on_drop=drops)
    spans = request_spans(10)
    for s in spans:
        processor.on_end(s)
    try:
        assert await asyncio.to_thread(processor.force_flush, 10)  # the receiver runs on this loop
        got: list[Any] = sink.spans()
        assert [(g.trace_id, g.span_id, g.name) for g in got] == [
            (s.context.trace_id.to_bytes(16, "big"), s.context.span_id.to_bytes(8, "big"), s.name) for s in spans
        ]
        root = got[0]
        assert root.parent_span_id == (0xFEED).to_bytes(8, "big") and root.flags == 0x300
        assert (root.links[0].span_id, root.links[0].flags) == ((7).to_bytes(8, "big"), 0x300)
        assert drops.counts == Counter()
    finally:
        assert await asyncio.to_thread(processor.shutdown, 10)
        await sink.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_with_the_receiver_down_on_end_stays_cheap_and_every_span_is_counted() -> None:
    drops = Drops()
    # 0.5 s: shorter than the first back-off, so each export fails after one attempt
    exporter = otlp_exporter(f"http://127.0.0.1:{closed_port()}", timeout="0.5")
    processor = BatchSpanProcessor(
        exporter, max_queue_size=64, max_export_batch_size=16, schedule_delay=0.05, on_drop=drops
    )
    spans = request_spans(1250)
    began = time.perf_counter()
    for s in spans:
        processor.on_end(s)
    elapsed = time.perf_counter() - began
    assert elapsed < 0.5, f"{elapsed / len(spans) * 1e6:.1f} us per on_end"  # ~0.2 us each when measured
    assert drops.counts["queue_full"] >= len(spans) - 64 - 16  # the queue, and a batch in the thread
    assert processor.shutdown(30)  # each export fails within its timeout
    assert drops.counts["queue_full"] + drops.counts["export_failed"] == len(spans)
    assert drops.counts["export_failed"] > 0 and exporter.dropped == drops.counts["export_failed"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_gets_its_own_export_thread() -> None:
    exporter = Recording()
    processor = BatchSpanProcessor(exporter, schedule_delay=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads running
        pid = os.fork()
    if pid == 0:  # the child: the parent's thread is not here; a new one must export
        processor.on_end(span(1))
        os._exit(0 if processor.force_flush(10) and [len(b) for b in exporter.batches] == [1] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert exporter.batches == [] and processor.shutdown(10)
