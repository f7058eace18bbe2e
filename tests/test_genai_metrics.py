"""GenAI semantic-convention metrics (v1.41.0) reach real OTLP receivers (HTTP and gRPC), decoded.

Names, units, buckets, attributes and temporality are read back from the protobuf the SDK's
exporters sent; the proxy runs for real against a fake upstream, configured by OTEL_* only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import pytest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from proxy.config.settings import Settings
from proxy.serve import running
from proxy.telemetry.genai_metrics import (
    BUCKETS_SPEC_SECONDS,
    BUCKETS_SPEC_TOKENS,
    GenAIMetrics,
    build_meter_provider,
    shutdown_meter_provider,
)
from proxy.telemetry.metric_pipeline import MetricPipeline
from proxy.telemetry.metrics import BUCKETS_LATENCY, BUCKETS_OVERHEAD, ModelLabels
from proxy.telemetry.semconv import ENV, SCHEMA_URL_RELEASED, Conventions
from tests.fakes import (
    FakeUpstream,
    OTLPGrpcMetricsSink,
    OTLPSink,
    chat_chunk,
    decode_metrics,
    json_handler,
    record_for,
    sse,
    stream_handler,
    usage_chunk,
)
from tests.otel_versions import ENCODER_WRITES_SCOPE_FIELDS

CUMULATIVE, DELTA = 2, 1  # opentelemetry.proto AggregationTemporality
GENAI = {
    "gen_ai.client.operation.duration": ("s", BUCKETS_SPEC_SECONDS),
    "gen_ai.client.token.usage": ("{token}", BUCKETS_SPEC_TOKENS),
    "gen_ai.client.operation.time_to_first_chunk": ("s", BUCKETS_SPEC_SECONDS),
    "gen_ai.client.operation.time_per_output_chunk": ("s", BUCKETS_SPEC_SECONDS),
    "taotrace.time_to_first_token": ("s", BUCKETS_LATENCY),
    "taotrace.time_to_first_answer_token": ("s", BUCKETS_LATENCY),
    "taotrace.thinking": ("s", BUCKETS_LATENCY),
    "taotrace.phase.duration": ("s", BUCKETS_LATENCY),
    "taotrace.proxy.overhead": ("s", BUCKETS_OVERHEAD),
}


def attrs(point: Any) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in point.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out


def points(metrics: list[Any], name: str) -> list[Any]:
    return [p for m in metrics if m.name == name for p in m.histogram.data_points]


async def exercise(proxy_url: str, upstream: FakeUpstream, client: aiohttp.ClientSession) -> None:
    """A stream whose first chunk (role only) comes 0.2 s before its first token (a reasoning one,
    0.2 s before the answer's first), then a 401."""
    frames = sse(
        chat_chunk(role="assistant", content=""),
        chat_chunk(reasoning_content="hm"),
        chat_chunk("Hi"),
        chat_chunk(" there"),
        chat_chunk(finish="stop"),
        usage_chunk(12, 3),
    )  # 6 chunks: [DONE] is not one
    upstream.handler = stream_handler(frames, first_delay=0.02, gap=0.2)
    async with client.post(proxy_url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "stream": True}) as r:
        await r.read()
    upstream.handler = json_handler({"error": {"message": "no"}}, status=401)
    async with client.post(proxy_url + "/v1/chat/completions", json={"model": "gpt-4o-mini"}) as r:
        await r.read()
    async with client.get(proxy_url + "/v1/models") as r:  # not a GenAI operation: not recorded
        await r.read()


async def run_proxy(
    env: dict[str, str], upstream: FakeUpstream, client: aiohttp.ClientSession, **settings: Any
) -> None:
    provider = build_meter_provider(env)
    assert provider is not None
    async with running(
        Settings(upstream=upstream.url, port=0, metrics_port=0, **settings), meter_provider=provider
    ) as srv:
        await exercise(srv.proxy_url, upstream, client)
    assert await asyncio.to_thread(shutdown_meter_provider, provider, 10.0)


def check_spec_shape(metrics: list[Any], upstream: FakeUpstream, temporality: int) -> None:
    host, port = upstream.url.removeprefix("http://").split(":")
    for m in metrics:
        unit, bounds = GENAI[m.name]
        assert m.unit == unit, m.name
        assert m.histogram.aggregation_temporality == temporality, m.name
        for p in m.histogram.data_points:
            assert tuple(p.explicit_bounds) == pytest.approx(bounds), m.name
            a = attrs(p)
            if m.name == "taotrace.proxy.overhead":  # like /metrics: api and stage only
                assert set(a) == {"taotrace.api", "taotrace.stage"}
                continue
            assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
            assert a["gen_ai.request.model"] == "gpt-4o-mini"
            assert a["server.address"] == host and a["server.port"] == int(port)
    assert {m.name for m in metrics} == set(GENAI)

    duration = {attrs(p).get("error.type"): p for p in points(metrics, "gen_ai.client.operation.duration")}
    assert set(duration) == {None, "auth"} and all(p.count == 1 for p in duration.values())
    assert 0.4 < duration[None].sum < 3.0
    tokens = {attrs(p)["gen_ai.token.type"]: p for p in points(metrics, "gen_ai.client.token.usage")}
    assert (tokens["input"].sum, tokens["output"].sum) == (12, 3)
    assert attrs(tokens["input"])["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"

    (ttfc,) = points(metrics, "gen_ai.client.operation.time_to_first_chunk")
    (ttft,) = points(metrics, "taotrace.time_to_first_token")
    assert ttfc.count == ttft.count == 1
    assert ttft.sum - ttfc.sum > 0.15  # first chunk (role only) is not first token
    assert "taotrace.api" in attrs(ttft) and "taotrace.api" not in attrs(ttfc)  # ours only on ours
    (ttfat,) = points(metrics, "taotrace.time_to_first_answer_token")
    (thinking,) = points(metrics, "taotrace.thinking")
    assert ttfat.count == thinking.count == 1 and attrs(ttfat) == attrs(thinking) == attrs(ttft)
    assert ttfat.sum == pytest.approx(ttft.sum + thinking.sum) and thinking.sum > 0.15  # the reasoning came first
    (tpoc,) = points(metrics, "gen_ai.client.operation.time_per_output_chunk")
    assert tpoc.count == 5  # per chunk after the first
    assert 0.7 < tpoc.sum < 2.0
    phases: dict[object, int] = {}
    for p in points(metrics, "taotrace.phase.duration"):  # the 401 has no response model: its own point
        phases[attrs(p)["taotrace.phase"]] = phases.get(attrs(p)["taotrace.phase"], 0) + p.count
    assert phases == {"network": 2, "prefill_wait": 1, "decode": 1}
    overhead = {
        (attrs(p)["taotrace.api"], attrs(p)["taotrace.stage"]): p for p in points(metrics, "taotrace.proxy.overhead")
    }
    assert overhead[("chat_completions", "request")].count == 2  # every request written upstream
    assert overhead[("other", "request")].count == 1  # not a GenAI operation, still the proxy's cost
    assert overhead[("chat_completions", "relay")].count >= 2  # per upstream read
    assert overhead[("chat_completions", "request")].sum < 0.1


TEMPORALITIES = {"cumulative": CUMULATIVE, "delta": DELTA, "lowmemory": DELTA}


def receiver_env(protocol: str, url: str, temporality: str) -> dict[str, str]:
    env = {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": temporality}
    if protocol == "grpc":
        return {**env, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": url, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    return {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": url}


@pytest.mark.parametrize("temporality", ["cumulative", "delta"])
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
async def test_a_real_receiver_gets_the_spec_shape(
    protocol: str, temporality: str, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    sink: OTLPSink | OTLPGrpcMetricsSink = OTLPGrpcMetricsSink() if protocol == "grpc" else await OTLPSink().start()
    try:
        await run_proxy(receiver_env(protocol, sink.url, temporality), upstream, client)
        check_spec_shape(sink.metrics(), upstream, TEMPORALITIES[temporality])
        if isinstance(sink, OTLPSink):
            assert sink.payloads == []  # no traces were asked for here
    finally:
        if isinstance(sink, OTLPSink):
            await sink.close()
        else:
            await asyncio.to_thread(sink.close)


def scoped(payloads: list[bytes]) -> dict[str, dict[str, Any]]:
    """schema URL -> metric name -> metric, over every export request."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    out: dict[str, dict[str, Any]] = {}
    for payload in payloads:
        for rm in ExportMetricsServiceRequest.FromString(payload).resource_metrics:
            for sm in rm.scope_metrics:
                assert sm.scope.name == "taotrace"
                for m in sm.metrics:
                    out.setdefault(sm.schema_url, {})[m.name] = m
    return out


@pytest.mark.parametrize("opt_in", ["", "gen_ai_latest_experimental", "gen_ai_latest_experimental/dup"])
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
async def test_each_convention_choice_over_each_protocol(
    opt_in: str, protocol: str, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    """Released names, latest experimental (token usage a monotonic Sum) or both, one scope per
    convention version with its schema URL; `lowmemory` makes the counter delta too."""
    sink: OTLPSink | OTLPGrpcMetricsSink = OTLPGrpcMetricsSink() if protocol == "grpc" else await OTLPSink().start()
    try:
        env = {**receiver_env(protocol, sink.url, "lowmemory"), ENV: opt_in}
        conventions = Conventions.from_env(env)
        provider = build_meter_provider(env)
        assert provider is not None
        genai = GenAIMetrics(provider, server_address="h", server_port=1, models=ModelLabels(), conventions=conventions)
        genai(record_for("chat_completions", "m", 200, random.Random(3), tokens=20))
        genai.stop()
        assert await asyncio.to_thread(shutdown_meter_provider, provider, 10.0)
        payloads = sink.payloads if isinstance(sink, OTLPGrpcMetricsSink) else sink.metric_payloads
        got = scoped(payloads)
    finally:
        if isinstance(sink, OTLPSink):
            await sink.close()
        else:
            await asyncio.to_thread(sink.close)
    if ENCODER_WRITES_SCOPE_FIELDS:  # an older OTLP encoder sends no scope schema URL
        assert set(got) == {m.schema_url for m in conventions.metrics}
        if conventions.released:
            assert "taotrace.phase.duration" in got[SCHEMA_URL_RELEASED]  # ours on the first scope
    metrics = {name: m for scope in got.values() for name, m in scope.items()}
    if conventions.released:
        assert metrics["gen_ai.client.token.usage"].histogram.aggregation_temporality == DELTA
    if conventions.latest:
        tokens = metrics["gen_ai.client.inference.tokens"]
        assert tokens.WhichOneof("data") == "sum" and tokens.sum.is_monotonic
        assert tokens.sum.aggregation_temporality == DELTA
        assert sorted(p.as_int for p in tokens.sum.data_points) == [20, 100]
        assert metrics["gen_ai.client.inference.duration"].histogram.data_points[0].count == 1


async def test_exports_every_interval_and_delta_points_add_up(
    upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    """OTEL_METRIC_EXPORT_INTERVAL: exports while running; with delta, no request counted twice."""
    sink = await OTLPSink().start()
    try:
        env = {**receiver_env("http/protobuf", sink.url, "delta"), "OTEL_METRIC_EXPORT_INTERVAL": "100"}
        provider = build_meter_provider(env)
        assert provider is not None
        upstream.handler = json_handler({"id": "x", "model": "m", "choices": []})
        async with running(Settings(upstream=upstream.url, port=0, metrics_port=0), meter_provider=provider) as srv:
            for _ in range(3):
                async with client.post(srv.proxy_url + "/v1/chat/completions", json={"model": "m"}) as r:
                    await r.read()
                await asyncio.sleep(0.35)
            during = len(sink.metric_payloads)
        assert await asyncio.to_thread(shutdown_meter_provider, provider, 10.0)
    finally:
        await sink.close()
    assert during >= 2  # exported while running, not only at shutdown
    counts = [p.count for p in points(decode_metrics(sink.metric_payloads), "gen_ai.client.operation.duration")]
    assert sum(counts) == 3


@pytest.mark.parametrize("in_flight", [False, True])
async def test_shutdown_never_waits_past_its_timeout_for_a_dead_collector(
    blackhole: int, in_flight: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`in_flight`: an interval's export is already stuck on the collector when shutdown comes."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")  # read by the SDK's exporter, from the process
    env = {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{blackhole}",
        "OTEL_METRIC_EXPORT_INTERVAL": "100" if in_flight else "60000",
    }
    provider = build_meter_provider(env)
    assert provider is not None
    genai = GenAIMetrics(provider, server_address="h", server_port=1, models=ModelLabels())
    genai(record_for("chat_completions", "m", 200, random.Random(1)))
    genai.stop()
    if in_flight:
        await asyncio.sleep(0.3)
    began = time.monotonic()
    assert not await asyncio.to_thread(shutdown_meter_provider, provider, 0.3)
    # 0.3 s asked; waiting for the stuck export would take the rest of the exporter's 2 s (1.8 s at least)
    assert time.monotonic() - began < 1.6
    # The abandoned export ends by the exporter's timeout (its last words logged in this test, not a later one).
    for _ in range(100):
        if not any(t.name == "taotrace-metrics-export" for t in threading.enumerate()):
            break
        await asyncio.sleep(0.1)


CONSOLE_SCRIPT = """
import random
from proxy.telemetry.genai_metrics import GenAIMetrics, build_meter_provider, shutdown_meter_provider
from proxy.telemetry.metrics import ModelLabels
from tests.fakes import record_for

provider = build_meter_provider()
genai = GenAIMetrics(provider, server_address="h", server_port=1, models=ModelLabels())
genai(record_for("chat_completions", "m", 200, random.Random(2)))
genai.stop()
assert shutdown_meter_provider(provider, 5.0)
"""


@pytest.mark.e2e  # a process of its own
def test_console_prints_the_sdk_s_json_per_export() -> None:
    """`console` is the SDK's ConsoleMetricExporter: each export as its JSON document on stdout
    (the process's: the SDK binds it when imported), under the SDK's resource."""
    import subprocess

    env = {**os.environ, "OTEL_METRICS_EXPORTER": "console", "OTEL_SERVICE_NAME": "svc"}
    done = subprocess.run(
        [sys.executable, "-c", CONSOLE_SCRIPT], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    (rm,) = json.loads(done.stdout)["resource_metrics"]
    assert rm["resource"]["attributes"]["service.name"] == "svc"
    (sm,) = rm["scope_metrics"]
    assert sm["scope"]["name"] == "taotrace" and sm["schema_url"] == SCHEMA_URL_RELEASED
    duration = next(m for m in sm["metrics"] if m["name"] == "gen_ai.client.operation.duration")
    assert duration["data"]["data_points"][0]["count"] == 1 and duration["unit"] == "s"


@pytest.mark.skipif(sys.platform != "linux", reason="--workers needs SO_REUSEPORT (Linux)")
async def test_each_worker_exports_its_own_under_its_instance_id(upstream: FakeUpstream) -> None:
    """`--workers 2`: each worker records and exports the requests it served, under the group's
    resource with its own `service.instance.id` (as the OpenTelemetry way has it); together they
    are every request, once."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from proxy.workers.supervisor import supervising

    sink = await OTLPSink().start()
    requests = 12
    try:
        env = {**os.environ, "OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}
        settings = Settings(upstream=upstream.url, port=0, metrics_port=0, workers=2)
        async with supervising(settings, env=env) as group:
            for _ in range(requests):  # a connection each: the kernel spreads them over the workers
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as own:
                    async with own.post(group.proxy_url + "/v1/chat/completions", json={"model": "m"}) as r:
                        assert r.status == 200 and await r.read() == b'{"ok": true}'
        # Each exports its last interval as it exits (cumulative: its last point is its total).
        counted: dict[str, int] = {}
        for payload in sink.metric_payloads:
            req = ExportMetricsServiceRequest()
            req.ParseFromString(payload)
            for rm in req.resource_metrics:
                resource = {kv.key: kv.value.string_value for kv in rm.resource.attributes}
                assert resource["service.name"] == "taotrace"
                metrics = [m for sm in rm.scope_metrics for m in sm.metrics]
                total = sum(p.count for p in points(metrics, "gen_ai.client.operation.duration"))
                instance = resource["service.instance.id"]
                counted[instance] = max(counted.get(instance, 0), total)
        assert len(counted) == 2, counted  # both served, each under its own id
        assert sum(counted.values()) == requests
    finally:
        await sink.close()


async def test_model_label_is_bounded_as_on_prometheus(upstream: FakeUpstream, client: aiohttp.ClientSession) -> None:
    sink = await OTLPSink().start()
    try:
        env = {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}
        provider = build_meter_provider(env)
        assert provider is not None
        upstream.handler = json_handler({"id": "x", "model": "invented-9", "choices": []})
        async with running(
            Settings(upstream=upstream.url, port=0, metrics_port=0, model_allowlist=["gpt-4o"]),
            meter_provider=provider,
        ) as srv:
            for name in ("gpt-4o", "invented-1", "invented-2"):
                async with client.post(srv.proxy_url + "/v1/chat/completions", json={"model": name}) as r:
                    await r.read()
            async with client.get(srv.metrics_url + "/metrics") as r:
                prom = await r.text()
        await asyncio.to_thread(shutdown_meter_provider, provider, 10.0)
        seen = {
            (attrs(p)["gen_ai.request.model"], attrs(p)["gen_ai.response.model"]): p.count
            for p in points(sink.metrics(), "gen_ai.client.operation.duration")
        }
        assert seen == {("gpt-4o", "other"): 1, ("other", "other"): 2}
        assert 'model="other"' in prom and "invented" not in prom
    finally:
        await sink.close()


def test_metrics_export_is_opt_in() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}
    assert build_meter_provider({}) is None
    assert build_meter_provider(endpoint) is None  # traces only
    assert build_meter_provider({"OTEL_METRICS_EXPORTER": "otlp"}) is None  # no endpoint: nothing leaves
    assert build_meter_provider({"OTEL_METRICS_EXPORTER": "none", **endpoint}) is None
    assert build_meter_provider({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true", **endpoint}) is None


def test_the_exporter_list_and_the_protocol_choose_the_sdk_s_exporters(caplog: pytest.LogCaptureFixture) -> None:
    """A comma list; `otlp` by OTEL_EXPORTER_OTLP_(METRICS_)PROTOCOL; a name nothing is installed
    under, or a protocol the Python exporters lack (http/json), is a warning, never protobuf."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as Http
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

    from proxy.telemetry.metric_pipeline import exporters_from_env

    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}
    cases: list[tuple[dict[str, str], list[type]]] = [
        ({"OTEL_METRICS_EXPORTER": " otlp , console ", **endpoint}, [Http, ConsoleMetricExporter]),
        ({"OTEL_METRICS_EXPORTER": "console,none,console"}, [ConsoleMetricExporter]),
        ({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", **endpoint}, [Grpc]),
        ({"OTEL_METRICS_EXPORTER": "otlp_proto_grpc", **endpoint}, [Grpc]),
        ({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json", **endpoint}, []),
        ({"OTEL_METRICS_EXPORTER": "nonesuch,console"}, [ConsoleMetricExporter]),
    ]
    for env, kinds in cases:
        exporters = exporters_from_env(env)
        try:
            assert [type(e) for e in exporters] == kinds, env
        finally:
            for e in exporters:
                e.shutdown()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'http/json'" in m for m in warned) and any("'nonesuch'" in m for m in warned), warned


class Kept(MetricExporter):
    """An exporter of a package of its own (registered under the SDK's entry-point group by the test)."""

    got: ClassVar[list[MetricsData]] = []

    def __init__(self) -> None:
        super().__init__()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.got.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def test_an_exporter_registered_as_an_entry_point_is_found_by_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist = tmp_path / "kept_exporter-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kept-exporter\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[opentelemetry_metrics_exporter]\nkept = {__name__}:Kept\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    Kept.got.clear()
    provider = build_meter_provider({"OTEL_METRICS_EXPORTER": "kept,console"})
    assert provider is not None and [type(e).__name__ for e in provider.exporters] == ["Kept", "ConsoleMetricExporter"]
    genai = GenAIMetrics(provider, server_address="h", server_port=1, models=ModelLabels())
    genai(record_for("chat_completions", "m", 200, random.Random(7)))
    genai.stop()
    assert shutdown_meter_provider(provider, 5.0)
    (data,) = Kept.got
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert "gen_ai.client.operation.duration" in names


async def test_a_refused_export_is_our_collector_line(caplog: pytest.LogCaptureFixture) -> None:
    """The SDK exporter's give-up record becomes the rate-limited line naming the metrics endpoint
    and the status; nothing raw gets through."""
    from proxy.telemetry.collector_log import collector_warnings

    sink = await OTLPSink(status=400).start()
    try:
        env = {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": sink.url + "/v1/metrics"}
        provider = build_meter_provider(env)
        assert provider is not None
        genai = GenAIMetrics(provider, server_address="h", server_port=1, models=ModelLabels())
        with caplog.at_level(logging.DEBUG):
            async with collector_warnings(env, logging.getLogger("taotrace")):
                genai(record_for("chat_completions", "m", 200, random.Random(4)))
                genai.stop()
                assert await asyncio.to_thread(shutdown_meter_provider, provider, 10.0)  # finished, if refused
    finally:
        await sink.close()
    assert len(sink.metric_payloads) == 1  # a 400 is final: not retried
    ours = [r.getMessage() for r in caplog.records if r.name == "taotrace"]
    assert ours and ours[0].startswith(f"OTLP export to {sink.url} failed: HTTP 400 Bad Request;"), ours
    assert [r for r in caplog.records if r.name != "taotrace" and r.levelno >= logging.WARNING] == []


async def test_a_dead_grpc_collector_is_our_collector_line(caplog: pytest.LogCaptureFixture) -> None:
    """Over gRPC the SDK's exporter retries a refused connection; its records become our line
    (while it retries, from its first attempt on), and the exit does not wait for it."""
    from proxy.telemetry.collector_log import collector_warnings

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_METRIC_EXPORT_INTERVAL": "100",
    }
    provider = build_meter_provider(env)
    assert provider is not None
    genai = GenAIMetrics(provider, server_address="h", server_port=1, models=ModelLabels())
    with caplog.at_level(logging.DEBUG):
        async with collector_warnings(env, logging.getLogger("taotrace")):
            genai(record_for("chat_completions", "m", 200, random.Random(8)))
            genai.stop()
            for _ in range(100):  # the first attempt fails at once; its retry waits ~1 s
                if any(r.name == "taotrace" for r in caplog.records):
                    break
                await asyncio.sleep(0.1)
            began = time.monotonic()
            await asyncio.to_thread(shutdown_meter_provider, provider, 0.5)
            assert time.monotonic() - began < 3.0
    ours = [r.getMessage() for r in caplog.records if r.name == "taotrace"]
    assert ours and ours[0].startswith(f"OTLP export to {endpoint} failed: "), ours
    assert [r for r in caplog.records if r.name.startswith("opentelemetry") and r.levelno >= logging.WARNING] == []


def test_each_kind_of_request_records_under_its_own_attribute_sets() -> None:
    """Sets made once per kind of request (model, error, route, ...) and reused: the points are
    those of sets made afresh for every record (a cache of 2 kinds is cleared again and again)."""
    rnd = random.Random(5)
    kinds: list[tuple[str, str, int, Any, str]] = [  # error types as a worker of another version might send
        ("chat_completions", "gpt-4o", 200, "", ""),
        ("chat_completions", "gpt-4o", 429, "rate_limited", ""),
        ("chat_completions", "gpt-4o", 500, "something_new", ""),  # not one of ours: _OTHER
        ("responses", "o3", 200, "", "eu"),
        ("chat_completions", "gpt-4o", 200, "", "eu"),
    ]
    records = [
        replace(record_for(api, model, status, rnd), error_type=error, upstream=route)
        for _ in range(3)
        for api, model, status, error, route in kinds
    ]
    collected = []
    for kept in (2, 1000):
        pipeline = MetricPipeline(clock=lambda: 1)
        genai = GenAIMetrics(
            pipeline, server_address="api.example", server_port=443, models=ModelLabels(),
            upstreams={"eu": ("eu.example", 8443)}, sets_kept=kept,
        )  # fmt: skip
        for rec in records:
            genai(rec)
        genai.stop()
        collected.append(pipeline.collect())
    assert collected[0] == collected[1]
    duration = next(m for s in collected[0] for m in s.metrics if m.name == "gen_ai.client.operation.duration")
    got = {
        (p.attributes["gen_ai.request.model"], p.attributes.get("error.type"), p.attributes["server.address"]): p.count
        for p in duration.data.data_points
    }
    assert got == {
        ("gpt-4o", None, "api.example"): 3, ("gpt-4o", "rate_limited", "api.example"): 3,
        ("gpt-4o", "_OTHER", "api.example"): 3, ("o3", None, "eu.example"): 3, ("gpt-4o", None, "eu.example"): 3,
    }  # fmt: skip


def test_the_recorder_gives_the_gil_back_while_it_records() -> None:
    """As the span exporter: every process that records relays streams too (one process, or each worker)."""
    from proxy.config.config import load
    from proxy.reporting.reporting import genai_metrics_for

    provider = build_meter_provider({"OTEL_METRICS_EXPORTER": "console"})
    assert provider is not None
    genai = genai_metrics_for(load(Settings(upstream="http://h:1"), {}), provider, ModelLabels(), {})
    try:
        assert genai.yield_gil is True
    finally:
        genai.stop()
        shutdown_meter_provider(provider, 1.0)


def test_token_usage_is_what_was_reported_never_a_count() -> None:
    """`gen_ai.client.token.usage` holds billed counts only: a stream whose output was counted
    records its input when the upstream reported it (Anthropic's `message_start`), not the count."""
    from proxy.dialects import Usage

    rnd = random.Random(6)
    base = record_for("messages", "claude", 200, rnd)
    records = [
        replace(base, usage=Usage(1000, 7, None, None), usage_source="reported"),
        replace(base, usage=Usage(2000, 5, None, None), usage_source="counted"),  # cut before message_delta
        replace(base, usage=Usage(None, 9, None, None), usage_source="counted"),  # no usage at all
    ]
    pipeline = MetricPipeline(clock=lambda: 1)
    genai = GenAIMetrics(pipeline, server_address="api.example", server_port=443, models=ModelLabels())
    for rec in records:
        genai(rec)
    genai.stop()
    usage = next(m for s in pipeline.collect() for m in s.metrics if m.name == "gen_ai.client.token.usage")
    by_type = {p.attributes["gen_ai.token.type"]: (p.count, p.sum) for p in usage.data.data_points}
    assert by_type == {"input": (2, 3000), "output": (1, 7)}
