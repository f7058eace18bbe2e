"""`/embeddings` is a dialect of its own (operation `embeddings`, input tokens, duration, no
TTFT); the models list and other paths stay `other`, with their status and duration."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web

from proxy.dialects import API_EMBEDDINGS, EMBEDDINGS_FULL_PARSE, Usage, read_body
from tests.conftest import ProxyFactory
from tests.fakes import json_handler

EMBEDDING = {
    "object": "list",
    "data": [{"object": "embedding", "index": 0, "embedding": [0.1, -0.2, 0.3]}],
    "model": "text-embedding-3-small",
    "usage": {"prompt_tokens": 8, "total_tokens": 8},
}


async def test_embeddings_span_and_metrics(start_proxy: ProxyFactory, client: aiohttp.ClientSession) -> None:
    async with start_proxy() as p:
        p.serve(json_handler(EMBEDDING))
        body = {"model": "text-embedding-3-small", "input": "the food was delicious"}
        async with client.post(p.url + "/v1/embeddings", json=body) as r:
            assert r.status == 200 and (await r.json()) == EMBEDDING
        p.serve(json_handler({"object": "list", "data": [{"id": "gpt-4o"}]}))
        async with client.get(p.url + "/v1/models") as r:
            assert r.status == 200
        async with aiohttp.ClientSession() as s, s.get(p.metrics_url + "/metrics") as resp:
            text = await resp.text()
    emb, models = (s for s in p.spans() if s.kind.name == "CLIENT")
    assert emb.name == "embeddings text-embedding-3-small"
    a = emb.attributes
    assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["taotrace.api"]) == (
        "embeddings",
        "openai",
        "embeddings",
    )
    assert a["gen_ai.usage.input_tokens"] == 8 and "gen_ai.usage.output_tokens" not in a
    assert a["gen_ai.response.model"] == "text-embedding-3-small"
    assert "gen_ai.response.time_to_first_chunk" not in a and a["taotrace.duration"] > 0
    rec = p.records[0]
    assert rec.api == "embeddings" and rec.usage_source == "reported" and rec.timing.ttft is None
    assert models.name == "GET" and models.attributes["taotrace.api"] == "other"
    assert models.attributes["http.response.status_code"] == 200 and p.records[1].timing.duration > 0
    assert (
        'taotrace_tokens_total{api="embeddings",model="text-embedding-3-small",type="input",upstream="127.0.0.1"} 8.0'
        in text
    )
    assert (
        'taotrace_request_duration_seconds_count{api="embeddings",model="text-embedding-3-small",upstream="127.0.0.1"} 1.0'
        in text
    )
    assert 'taotrace_request_duration_seconds_count{api="other",model="unknown",upstream="127.0.0.1"} 1.0' in text
    assert (
        'taotrace_requests_total{api="other",error_type="",model="unknown",status_code="200",upstream="127.0.0.1"} 1.0'
        in text
    )
    assert (
        'taotrace_time_to_first_token_seconds_count{api="embeddings",model="text-embedding-3-small",upstream="127.0.0.1"} 0.0'
        in text
    )


def _big(usage_first: bool) -> bytes:
    data = [{"object": "embedding", "index": i, "embedding": [0.0123456] * 1536} for i in range(40)]
    head = {"usage": {"prompt_tokens": 321, "total_tokens": 321}, "model": "text-embedding-3-large"}
    body = {**head, "object": "list", "data": data} if usage_first else {"object": "list", "data": data, **head}
    return json.dumps(body).encode()


@pytest.mark.parametrize("usage_first", [False, True])
def test_a_large_embeddings_body_is_read_from_its_ends(usage_first: bool) -> None:
    body = _big(usage_first)
    assert len(body) > EMBEDDINGS_FULL_PARSE * 4
    reader = read_body(API_EMBEDDINGS, body)
    assert reader is not None and reader.usage == Usage(input_tokens=321)
    assert reader.response_model == "text-embedding-3-large"


def test_a_large_embeddings_body_without_usage_stays_unknown() -> None:
    body = json.dumps({"object": "list", "data": [{"embedding": [0.5] * 30000}]}).encode()
    reader = read_body(API_EMBEDDINGS, body)
    assert reader is not None and reader.usage is None and reader.response_model is None


async def test_a_large_embeddings_response_through_the_proxy(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    body = _big(usage_first=False)

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    async with start_proxy() as p:
        p.serve(handler)
        async with client.post(p.url + "/v1/embeddings", json={"model": "text-embedding-3-large", "input": "x"}) as r:
            assert await r.read() == body  # forwarded byte for byte
    assert p.records[0].usage.input_tokens == 321 and p.records[0].usage_source == "reported"
