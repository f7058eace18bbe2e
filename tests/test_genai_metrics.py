"""GenAI semantic-convention metrics (v1.41.0) reach real OTLP receivers (HTTP and gRPC), decoded.

Names, units, buckets, attributes and temporality are read back from the protobuf the SDK's own
exporters sent; the proxy runs for real against a fake upstream, configured by OTEL_* only.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import aiohttp
import pytest

from proxy.serve import running
from proxy.settings import Settings
from proxy.telemetry.genai_metrics import (
    BUCKETS_SPEC_SECONDS,
    BUCKETS_SPEC_TOKENS,
    build_meter_provider,
    shutdown_meter_provider,
)
from proxy.telemetry.metrics import BUCKETS_LATENCY, BUCKETS_OVERHEAD
from tests.fakes import (
    FakeUpstream,
    OTLPGrpcMetricsSink,
    OTLPSink,
    chat_chunk,
    json_handler,
    sse,
    stream_handler,
    usage_chunk,
)

CUMULATIVE, DELTA = 2, 1  # opentelemetry.proto AggregationTemporality
GENAI = {
    "gen_ai.client.operation.duration": ("s", BUCKETS_SPEC_SECONDS),
    "gen_ai.client.token.usage": ("{token}", BUCKETS_SPEC_TOKENS),
    "gen_ai.client.operation.time_to_first_chunk": ("s", BUCKETS_SPEC_SECONDS),
    "gen_ai.client.operation.time_per_output_chunk": ("s", BUCKETS_SPEC_SECONDS),
    "taotrace.time_to_first_token": ("s", BUCKETS_LATENCY),
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
    """A stream whose first chunk (role only) comes 0.2 s before its first token, then a 401."""
    frames = sse(
        chat_chunk(role="assistant", content=""), chat_chunk("Hi"), chat_chunk(" there"), usage_chunk(12, 2)
    )  # 4 chunks: [DONE] is not one
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
    assert 0.4 < duration[None].sum < 2.0
    tokens = {attrs(p)["gen_ai.token.type"]: p for p in points(metrics, "gen_ai.client.token.usage")}
    assert (tokens["input"].sum, tokens["output"].sum) == (12, 2)
    assert attrs(tokens["input"])["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"

    (ttfc,) = points(metrics, "gen_ai.client.operation.time_to_first_chunk")
    (ttft,) = points(metrics, "taotrace.time_to_first_token")
    assert ttfc.count == ttft.count == 1
    assert ttft.sum - ttfc.sum > 0.15  # first chunk (role only) is not first token
    assert "taotrace.api" in attrs(ttft) and "taotrace.api" not in attrs(ttfc)  # ours only on ours
    (tpoc,) = points(metrics, "gen_ai.client.operation.time_per_output_chunk")
    assert tpoc.count == 3  # per chunk after the first
    assert 0.5 < tpoc.sum < 1.5
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


async def test_http_receiver_cumulative_by_default(upstream: FakeUpstream, client: aiohttp.ClientSession) -> None:
    sink = await OTLPSink().start()
    try:
        env = {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}
        await run_proxy(env, upstream, client)
        check_spec_shape(sink.metrics(), upstream, CUMULATIVE)
        assert sink.payloads == []  # no traces were asked for here
    finally:
        await sink.close()


@pytest.mark.skipif(sys.platform != "linux", reason="--telemetry-process needs SO_REUSEPORT (Linux)")
async def test_a_telemetry_process_records_and_exports_the_same(
    upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    """`--telemetry-process`: the worker ships its records, the supervisor records and exports them."""
    from proxy.workers.supervisor import supervising

    sink = await OTLPSink().start()
    try:
        env = {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}
        provider = build_meter_provider(env)
        assert provider is not None
        settings = Settings(upstream=upstream.url, port=0, metrics_port=0, telemetry_process=True)
        async with supervising(settings, env={**os.environ, **env}, meter_provider=provider) as group:
            await exercise(group.proxy_url, upstream, client)
        assert await asyncio.to_thread(shutdown_meter_provider, provider, 10.0)
        check_spec_shape(sink.metrics(), upstream, CUMULATIVE)
    finally:
        await sink.close()


async def test_grpc_receiver_delta_when_asked(upstream: FakeUpstream, client: aiohttp.ClientSession) -> None:
    sink = OTLPGrpcMetricsSink()
    try:
        env = {
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": sink.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta",
        }
        await run_proxy(env, upstream, client)
        check_spec_shape(sink.metrics(), upstream, DELTA)
    finally:
        await asyncio.to_thread(sink.close)


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
    assert build_meter_provider({}) is None
    assert build_meter_provider({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}) is None  # traces only
    assert build_meter_provider({"OTEL_METRICS_EXPORTER": "otlp"}) is None  # no endpoint: nothing leaves
    assert build_meter_provider({"OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}) is None
