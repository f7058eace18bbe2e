"""Every name the proxy emits is a name of the conventions it claims, read back from a real OTLP
receiver: spans and metrics, released names by default, the latest experimental ones or both
with `OTEL_SEMCONV_STABILITY_OPT_IN`; in one process and with two workers.

The tables are data, shipped with the tests: tests/data/semconv/v1.41.0.json is generated from
the conventions' model YAML at that tag (tests/data/semconv/generate.py); genai-v0.1.0.json is
what the first GenAI release changed over it; genai-latest-experimental.json the unreleased names.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.config.settings import Settings
from proxy.serve import running
from proxy.telemetry.genai_metrics import build_meter_provider, shutdown_meter_provider
from proxy.telemetry.semconv import ENV, SCHEMA_URL_LATEST, SCHEMA_URL_RELEASED, Conventions
from proxy.telemetry.tracing import build_tracing, shutdown_tracing
from tests.fakes import FakeUpstream, OTLPSink, chat_chunk, chat_stream, json_handler, sse, stream_handler, usage_chunk
from tests.otel_versions import ENCODER_WRITES_SCOPE_FIELDS

DATA = Path(__file__).parent / "data" / "semconv"
NAMESPACES = ("gen_ai", "server", "http", "url", "error", "user")
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
OTLP_KIND = {"histogram": "histogram", "counter": "sum", "updowncounter": "sum", "gauge": "gauge"}
MODES = ["one", pytest.param("workers", marks=pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT"))]


def _table(*names: str) -> dict[str, Any]:
    """The named tables, later ones over earlier ones."""
    merged: dict[str, Any] = {"attributes": {}, "metrics": {}}
    for name in names:
        data = json.loads((DATA / name).read_text())
        merged["attributes"].update(data["attributes"])
        merged["metrics"].update(data["metrics"])
        merged["schema_url"] = data.get("schema_url")
    return merged


RELEASED = _table("v1.41.0.json", "genai-v0.1.0.json")
LATEST = _table("v1.41.0.json", "genai-v0.1.0.json", "genai-latest-experimental.json")


def _value(kv: Any) -> tuple[str, object]:
    """(the table's type name, the value) of an OTLP KeyValue."""
    kind = kv.value.WhichOneof("value")
    if kind == "array_value":
        items = [getattr(v, v.WhichOneof("value")) for v in kv.value.array_value.values]
        return ("string[]" if all(isinstance(i, str) for i in items) else "array"), items
    name = {"string_value": "string", "int_value": "int", "double_value": "double", "bool_value": "boolean"}[kind]
    return name, getattr(kv.value, kind)


def check_names(attributes: Any, table: dict[str, Any], where: str) -> None:
    """Each attribute is the convention's (current, of its type) or ours (`taotrace.*`)."""
    for kv in attributes:
        if not kv.key.startswith(NAMESPACES):
            assert kv.key.startswith("taotrace."), f"{where}: {kv.key} is neither the conventions' nor ours"
            continue
        spec = table["attributes"].get(kv.key)
        assert spec is not None, f"{where}: {kv.key} is not in the conventions"
        assert not spec["deprecated"], f"{where}: {kv.key} is deprecated"
        kind, _ = _value(kv)
        assert spec["type"] in (kind, "any") or (spec["type"] == "string" and kind == "string"), (where, kv.key, kind)


def scopes(payloads: list[bytes], metrics: bool) -> list[tuple[str, Any]]:
    """(schema URL, span or metric) of every item the receiver got."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    found: list[tuple[str, Any]] = []
    for payload in payloads:
        if metrics:
            mreq = ExportMetricsServiceRequest()
            mreq.ParseFromString(payload)
            for sm in (sm for rm in mreq.resource_metrics for sm in rm.scope_metrics):
                url = sm.schema_url
                if not ENCODER_WRITES_SCOPE_FIELDS:  # an encoder before 1.31 leaves it out: the names tell it
                    latest = any(m.name.startswith("gen_ai.client.inference.") for m in sm.metrics)
                    url = SCHEMA_URL_LATEST if latest else SCHEMA_URL_RELEASED
                found += [(url, m) for m in sm.metrics]
        else:
            treq = ExportTraceServiceRequest()
            treq.ParseFromString(payload)
            found += [(ss.schema_url, s) for rs in treq.resource_spans for ss in rs.scope_spans for s in ss.spans]
    return found


def resources(payloads: list[bytes]) -> list[tuple[object, object]]:
    """(openinference.project.name, service.name) of each distinct resource the spans came with."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    found = set()
    for payload in payloads:
        req = ExportTraceServiceRequest()
        req.ParseFromString(payload)
        for rs in req.resource_spans:
            a = attrs(rs.resource)
            found.add((a.get("openinference.project.name"), a.get("service.name")))
    return sorted(found, key=str)


def points(metric: Any) -> list[Any]:
    kind = metric.WhichOneof("data")
    return list(getattr(metric, kind).data_points)


def attrs(item: Any) -> dict[str, object]:
    return {kv.key: _value(kv)[1] for kv in item.attributes}


@asynccontextmanager
async def proxied(upstream: FakeUpstream, sink: OTLPSink, mode: str, **settings: Any) -> AsyncIterator[str]:
    """The proxy exporting spans and metrics to `sink`; one process, or two workers each exporting
    its own (`workers`). Yields the proxy's URL; on exit everything has been exported."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        ENV: os.environ.get(ENV, ""),
    }
    env = {**os.environ, **env}  # OTEL_RESOURCE_ATTRIBUTES as the process has it
    config = Settings(upstream=upstream.url, port=0, metrics_port=0, drain_seconds=1.0, **settings)
    if mode == "one":
        tracer, meters = build_tracing(env), build_meter_provider(env)
        assert meters is not None
        async with running(config, tracing=tracer, meter_provider=meters) as srv:
            yield srv.proxy_url
        assert await asyncio.to_thread(shutdown_tracing, tracer, 10.0)
        assert await asyncio.to_thread(shutdown_meter_provider, meters, 10.0)
    else:
        from proxy.workers.supervisor import supervising

        config = config.model_copy(update={"workers": 2})
        async with supervising(config, env=env) as group:  # each worker flushes its own as it exits
            yield group.proxy_url


def _routed(upstream: FakeUpstream) -> None:
    """Answers by path: a chat stream with usage, one without (model `counted`), messages, responses."""
    with_usage = stream_handler(
        sse(chat_chunk(role="assistant", content=""), chat_chunk("Hi"), chat_chunk(finish="stop"),
            usage_chunk(12, 2, cached=4, reasoning=1))
    )  # fmt: skip
    without_usage = stream_handler(chat_stream(3, usage=False))
    messages = json_handler(
        {"id": "msg_1", "type": "message", "model": "claude-x", "role": "assistant", "stop_reason": "end_turn",
         "content": [{"type": "text", "text": "ok"}],
         "usage": {"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": 2}}
    )  # fmt: skip
    responses = json_handler(
        {"id": "resp_1", "object": "response", "model": "gpt-4o", "status": "completed",
         "output": [], "usage": {"input_tokens": 3, "output_tokens": 2}}
    )  # fmt: skip
    refused = json_handler({"error": {"message": "no"}}, status=401)
    models = json_handler({"object": "list", "data": []})

    async def handler(request: Any) -> Any:
        path = request.path
        if request.method == "GET":
            return await models(request)
        if path.endswith("/messages"):
            return await messages(request)
        if path.endswith("/responses"):
            return await responses(request)
        body = await request.json()
        if body.get("model") == "refused":
            return await refused(request)
        return await (without_usage if body.get("model") == "counted" else with_usage)(request)

    upstream.handler = handler


async def _traffic(url: str, client: aiohttp.ClientSession) -> None:
    chat = {
        "model": "gpt-4o-mini", "stream": True, "temperature": 0.5, "top_p": 0.9, "max_tokens": 50, "seed": 7,
        "stop": ["\n"], "n": 2, "frequency_penalty": 0.1, "presence_penalty": 0.2, "user": "u-1",
        "response_format": {"type": "json_object"}, "messages": [{"role": "user", "content": "hi"}],
    }  # fmt: skip
    messages = {
        "model": "claude-x", "max_tokens": 10, "top_k": 5, "temperature": 0.1, "stop_sequences": ["END"],
        "system": "be brief", "metadata": {"user_id": "u-2"}, "messages": [{"role": "user", "content": "hi"}],
    }  # fmt: skip
    for path, body in (
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", {"model": "counted", "stream": True, "messages": []}),
        ("/v1/chat/completions", {"model": "refused", "messages": []}),
        ("/v1/messages", messages),
        ("/v1/responses", {"model": "gpt-4o", "input": "hi", "max_output_tokens": 9}),
    ):
        async with client.post(url + path, json=body) as r:
            await r.read()
    async with client.get(url + "/v1/models") as r:
        await r.read()


@pytest.mark.parametrize("mode", MODES)
async def test_every_emitted_name_is_a_released_convention_name(
    mode: str, upstream: FakeUpstream, client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    # Grouping in a viewer (a project name) is the user's to set, on the resource
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=llm-proxy")
    _routed(upstream)
    sink = await OTLPSink().start()
    try:
        async with proxied(upstream, sink, mode, capture_content=True, attribute_body_user=True) as url:
            await _traffic(url, client)
        spans = scopes(sink.payloads, metrics=False)
        metrics = scopes(sink.metric_payloads, metrics=True)
    finally:
        await sink.close()

    assert {url for url, _ in spans} == {SCHEMA_URL_RELEASED}
    assert resources(sink.payloads) == [("llm-proxy", "taotrace")]
    roots = {s.name: s for _, s in spans if not s.parent_span_id}
    assert len(roots) == 6, sorted(roots)
    for _, span in spans:
        check_names(span.attributes, RELEASED, span.name)
    assert {url for url, _ in metrics} == {SCHEMA_URL_RELEASED}
    names = {m.name for _, m in metrics}
    assert {n for n in names if not n.startswith("taotrace.")} == {
        "gen_ai.client.operation.duration", "gen_ai.client.token.usage",
        "gen_ai.client.operation.time_to_first_chunk", "gen_ai.client.operation.time_per_output_chunk",
    }  # fmt: skip
    for _, metric in metrics:
        if not metric.name.startswith("taotrace."):
            spec = RELEASED["metrics"][metric.name]
            assert (metric.WhichOneof("data"), metric.unit) == (OTLP_KIND[spec["instrument"]], spec["unit"])
        for point in points(metric):
            check_names(point.attributes, RELEASED, metric.name)

    # v0.1.0 over v1.41: top_k is an int
    assert attrs(roots["chat claude-x"])["gen_ai.request.top_k"] == 5
    # Usage: gen_ai.usage.* only as reported (reasoning under its convention name); a count is ours
    reported = attrs(roots["chat gpt-4o-mini"])
    assert (reported["gen_ai.usage.output_tokens"], reported["gen_ai.usage.reasoning.output_tokens"]) == (2, 1)
    assert reported["gen_ai.usage.cache_read.input_tokens"] == 4
    counted = attrs(roots["chat counted"])
    assert not any(k.startswith("gen_ai.usage.") for k in counted), counted
    assert (counted["taotrace.usage_source"], counted["taotrace.token_events"]) == ("counted", 3)
    outputs = [
        attrs(p)["gen_ai.request.model"]
        for _, m in metrics
        if m.name == "gen_ai.client.token.usage"
        for p in points(m)
        if attrs(p)["gen_ai.token.type"] == "output"
    ]
    assert "counted" not in outputs and "gpt-4o-mini" in outputs


@pytest.mark.parametrize("opt_in", ["gen_ai_latest_experimental", "http,gen_ai_latest_experimental/dup"])
async def test_latest_experimental_names_when_asked(
    opt_in: str, upstream: FakeUpstream, client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, opt_in)
    _routed(upstream)
    sink = await OTLPSink().start()
    try:
        async with proxied(upstream, sink, "one") as url:
            await _traffic(url, client)
        spans = scopes(sink.payloads, metrics=False)
        metrics = scopes(sink.metric_payloads, metrics=True)
    finally:
        await sink.close()

    dup = opt_in.endswith("/dup")
    assert {url for url, _ in spans} == {SCHEMA_URL_RELEASED if dup else SCHEMA_URL_LATEST}
    by_scope: dict[str, set[str]] = {}
    for url, metric in metrics:
        by_scope.setdefault(url, set()).add(metric.name)
        table = LATEST if url == SCHEMA_URL_LATEST else RELEASED
        if not metric.name.startswith("taotrace."):
            spec = table["metrics"][metric.name]
            assert (metric.WhichOneof("data"), metric.unit) == (OTLP_KIND[spec["instrument"]], spec["unit"])
        for point in points(metric):
            check_names(point.attributes, table, metric.name)
    latest = {
        "gen_ai.client.inference.duration", "gen_ai.client.inference.tokens",
        "gen_ai.client.inference.time_to_first_chunk", "gen_ai.client.inference.time_per_output_chunk",
    }  # fmt: skip
    assert {n for n in by_scope[SCHEMA_URL_LATEST] if not n.startswith("taotrace.")} == latest
    assert (SCHEMA_URL_RELEASED in by_scope) == dup
    if dup:
        assert "gen_ai.client.token.usage" in by_scope[SCHEMA_URL_RELEASED]
    tokens = {
        (attrs(p)["gen_ai.request.model"], attrs(p)["gen_ai.token.type"]): p.as_int
        for _, m in metrics
        if m.name == "gen_ai.client.inference.tokens"
        for p in points(m)
    }
    assert tokens[("gpt-4o-mini", "input")] == 12 and tokens[("gpt-4o-mini", "output")] == 2
    assert ("counted", "output") not in tokens  # never our own count


def test_opt_in_values() -> None:
    assert Conventions.from_env({}) == Conventions(released=True, latest=False)
    assert Conventions.from_env({ENV: "http/dup, gen_ai_latest_experimental"}) == Conventions(False, True)
    assert Conventions.from_env({ENV: "gen_ai_latest_experimental/dup"}) == Conventions(True, True)
    assert Conventions.from_env({ENV: "gen_ai_latest"}) == Conventions()  # not a value of ours


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("parent", ["child", "link", "none"])
async def test_parent_modes_what_the_upstream_and_the_collector_see(
    parent: str, mode: str, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    upstream.handler = stream_handler(chat_stream(2))
    caller = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    sink = await OTLPSink().start()
    try:
        async with proxied(upstream, sink, mode, parent=parent) as url:
            body = {"model": "gpt-4o-mini", "stream": True, "messages": []}
            async with client.post(url + "/v1/chat/completions", json=body, headers={"traceparent": caller}) as r:
                await r.read()
            async with client.post(url + "/v1/chat/completions", json=body) as r:  # no trace of the caller's
                await r.read()
        spans = [s for _, s in scopes(sink.payloads, metrics=False)]
    finally:
        await sink.close()
    roots = [s for s in spans if s.name == "chat gpt-4o-mini"]
    assert len(roots) == 2
    first, second = (upstream.seen[0].headers["traceparent"], upstream.seen[1].headers["traceparent"])
    if parent == "child":
        root = next(s for s in roots if s.parent_span_id.hex() == CALLER_SPAN)
        assert root.trace_id.hex() == CALLER_TRACE
        assert first == f"00-{CALLER_TRACE}-{root.span_id.hex()}-01"  # ours, in the caller's trace
    else:
        assert first == caller  # unchanged
        assert all(not s.parent_span_id and s.trace_id.hex() != CALLER_TRACE for s in roots)
        linked = [(k.trace_id.hex(), k.span_id.hex()) for s in roots for k in s.links]
        assert linked == ([(CALLER_TRACE, CALLER_SPAN)] if parent == "link" else [])
    # without a caller's traceparent every mode sends ours
    other = next(s for s in roots if s.trace_id.hex() == second.split("-")[1])
    assert second.split("-")[2] == other.span_id.hex() and not other.links


def test_the_table_generator_reads_the_model_at_a_tag(tmp_path: Path) -> None:
    """tests/data/semconv/generate.py on a repository of the conventions' shape, at a tag."""
    import subprocess

    model = tmp_path / "model" / "gen-ai"
    model.mkdir(parents=True)
    (model / "registry.yaml").write_text(
        "groups:\n  - id: registry.gen_ai\n    type: attribute_group\n    attributes:\n"
        "      - id: gen_ai.request.top_k\n        stability: development\n        type: double\n"
        "      - id: gen_ai.system\n        stability: development\n        type:\n          members:\n"
        "            - id: openai\n              value: openai\n        deprecated: {reason: renamed}\n"
        "      - id: other.thing\n        type: string\n"
    )
    (model / "metrics.yaml").write_text(
        "groups:\n  - id: metric.gen_ai.client.token.usage\n    type: metric\n"
        "    metric_name: gen_ai.client.token.usage\n    instrument: histogram\n    unit: '{token}'\n"
    )
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "m"], check=True)
    subprocess.run([*git, "tag", "v9.9.9"], check=True)
    (model / "registry.yaml").write_text("groups: []\n")  # the work tree is not what is read
    out = subprocess.run(
        [sys.executable, str(DATA / "generate.py"), str(tmp_path / ".git"), "v9.9.9"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    table = json.loads(out)
    assert table["attributes"] == {
        "gen_ai.request.top_k": {"type": "double", "stability": "development", "deprecated": False},
        "gen_ai.system": {"type": "string", "stability": "development", "deprecated": True},
    }
    assert table["metrics"] == {
        "gen_ai.client.token.usage": {"instrument": "histogram", "unit": "{token}", "deprecated": False}
    }
    assert "v9.9.9" in table["source"]
    shipped = json.loads((DATA / "v1.41.0.json").read_text())
    assert "v1.41.0" in shipped["source"] and len(shipped["attributes"]) > 100
