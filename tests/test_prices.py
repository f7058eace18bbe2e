"""Cost, cache-aware: the price file, hand-computed costs for OpenAI's and Anthropic's ways of
reporting cached tokens, and the span attribute and counters they feed."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from proxy.accounting.prices import Price, PriceTable, cost_of, load_prices
from proxy.dialects import API_CHAT, API_MESSAGES, API_RESPONSES, Usage, read_body
from tests.conftest import ProxyFactory
from tests.fakes import json_handler

EXAMPLE = Path(__file__).resolve().parent.parent / "deploy" / "prices.example.toml"


@pytest.fixture(scope="module")
def table() -> PriceTable:
    return load_prices(EXAMPLE)


def test_the_example_file_loads_with_defaults_filled(table: PriceTable) -> None:
    assert table.currency == "USD" and table.fallback is None
    assert set(table.models) == {"gpt-4o-mini", "gpt-4o", "o3-mini", "claude-sonnet-4-5"}
    assert table.models["o3-mini"] == Price(
        input=1.10, output=4.40, cached_input=0.55, cache_write=1.10, reasoning=4.40
    )
    assert "EXAMPLE" in EXAMPLE.read_text().splitlines()[0]


def test_openai_prompt_tokens_include_the_cached_ones(table: PriceTable) -> None:
    body = {
        "id": "c",
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 1000,
            "completion_tokens": 200,
            "prompt_tokens_details": {"cached_tokens": 800},
            "completion_tokens_details": {"reasoning_tokens": 50},
        },
    }
    reader = read_body(API_CHAT, json.dumps(body).encode())
    assert reader is not None and reader.usage is not None
    cost = cost_of(table, reader.usage, "gpt-4o-mini", reader.response_model)
    # 200 fresh x 0.15 + 800 cached x 0.075 + 200 output (50 of them reasoning) x 0.60 = 210 per million
    assert cost.amount == pytest.approx(0.000210, rel=1e-12)
    assert cost.cache_savings == pytest.approx(800 * (0.15 - 0.075) / 1e6, rel=1e-12)  # 0.00006
    assert cost.currency == "USD"


def test_responses_api_usage_prices_the_same_way(table: PriceTable) -> None:
    body = {
        "id": "r",
        "model": "o3-mini",
        "status": "completed",
        "usage": {
            "input_tokens": 500,
            "input_tokens_details": {"cached_tokens": 400},
            "output_tokens": 1000,
            "output_tokens_details": {"reasoning_tokens": 900},
        },
    }
    reader = read_body(API_RESPONSES, json.dumps(body).encode())
    assert reader is not None and reader.usage is not None
    # 100 x 1.10 + 400 x 0.55 + 100 x 4.40 + 900 x 4.40 = 110 + 220 + 4400 = 4730 per million
    assert cost_of(table, reader.usage, "o3-mini").amount == pytest.approx(0.004730, rel=1e-12)


def test_anthropic_input_tokens_exclude_cache_reads_and_writes(table: PriceTable) -> None:
    body = {
        "id": "m",
        "model": "claude-sonnet-4-5",
        "stop_reason": "end_turn",
        "content": [{"type": "text", "text": "x"}],
        "usage": {
            "input_tokens": 100,
            "cache_read_input_tokens": 2000,
            "cache_creation_input_tokens": 500,
            "output_tokens": 300,
        },
    }
    reader = read_body(API_MESSAGES, json.dumps(body).encode())
    assert reader is not None
    assert reader.usage == Usage(2600, 300, 2000, None, cache_creation_input_tokens=500)
    cost = cost_of(table, reader.usage, "claude-sonnet-4-5")
    # 100 x 3.00 + 2000 x 0.30 + 500 x 3.75 + 300 x 15.00 = 300 + 600 + 1875 + 4500 = 7275 per million
    assert cost.amount == pytest.approx(0.007275, rel=1e-12)
    assert cost.cache_savings == pytest.approx(2000 * (3.00 - 0.30) / 1e6, rel=1e-12)  # 0.0054


def test_unlisted_models_are_unpriced_unless_there_is_a_fallback(table: PriceTable, tmp_path: Path) -> None:
    assert cost_of(table, Usage(10, 10), "mystery-model").amount is None
    path = tmp_path / "p.yaml"
    path.write_text("currency: EUR\nfallback: {input: 1.0, output: 2.0}\nmodels:\n  a: {input: 0.5, output: 1.0}\n")
    yaml_table = load_prices(path)
    cost = cost_of(yaml_table, Usage(1000, 1000), "mystery-model")
    assert cost.amount == pytest.approx(0.003, rel=1e-12) and cost.currency == "EUR"
    assert cost_of(yaml_table, Usage(1000, 1000), "unknown", response_model="a").amount == pytest.approx(0.0015)


@pytest.mark.parametrize(
    "name,text,reason",
    [
        ("p.json", "{}", "must end in .toml, .yaml or .yml"),
        ("p.toml", "currency = ", "not valid TOML"),
        ("p.toml", 'currency = "USD"\n[models.m]\ninput = -1\noutput = 1\n', "models.m.input"),
        ("p.toml", 'currency = "USD"\n[models.m]\ninput = 1\n', "models.m.output: Field required"),
        ("p.toml", 'currency = "USD"\n[models.m]\ninput = 1\noutput = 1\ncache_read = 1\n', "cache_read"),
        ("p.toml", 'currency = "USD"\n', "nothing to price"),
        ("p.yaml", "models: {}\n", "currency"),
    ],
)
def test_bad_price_files_say_what_is_wrong(tmp_path: Path, name: str, text: str, reason: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=reason):
        load_prices(path)
    with pytest.raises(ValueError, match="cannot read"):
        load_prices(tmp_path / "missing.toml")


def _chat(model: str, prompt: int, cached: int, completion: int) -> dict[str, object]:
    return {
        "id": "c",
        "model": model,
        "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


async def _metrics(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as resp:
        text = await resp.text()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("taotrace_cost")
    }


async def test_cost_on_spans_and_counters(start_proxy: ProxyFactory, client: aiohttp.ClientSession) -> None:
    async with start_proxy(prices=str(EXAMPLE)) as p:
        for model, prompt, cached, completion in (
            ("gpt-4o", 1000, 0, 100),
            ("gpt-4o", 2000, 1024, 10),
            ("llama-x", 5, 0, 5),
        ):
            p.serve(json_handler(_chat(model, prompt, cached, completion)))
            async with client.post(p.url + "/v1/chat/completions", json={"model": model}) as r:
                assert r.status == 200
                await r.read()
        p.serve(json_handler({"error": {"message": "no"}}, status=400))
        async with client.post(p.url + "/v1/chat/completions", json={"model": "gpt-4o"}) as r:
            assert r.status == 400
        got = await _metrics(p.metrics_url)
    roots = [s for s in p.spans() if s.kind.name == "CLIENT"]
    # 1000 x 2.50 + 100 x 10 = 3500; 976 x 2.50 + 1024 x 1.25 + 10 x 10 = 2440 + 1280 + 100 = 3820 (per million)
    assert roots[0].attributes["taotrace.cost"] == pytest.approx(0.0035, rel=1e-12)
    assert roots[1].attributes["taotrace.cost"] == pytest.approx(0.00382, rel=1e-12)
    assert roots[0].attributes["taotrace.cost.currency"] == "USD"
    assert "taotrace.cost" not in roots[2].attributes and "taotrace.cost" not in roots[3].attributes
    assert got['taotrace_cost_total{api="chat_completions",model="gpt-4o",upstream="127.0.0.1"}'] == pytest.approx(
        0.00732, rel=1e-12
    )
    assert got[
        'taotrace_cost_cache_savings_total{api="chat_completions",model="gpt-4o",upstream="127.0.0.1"}'
    ] == pytest.approx(0.00128)
    assert (
        got['taotrace_cost_unpriced_requests_total{api="chat_completions",model="llama-x",upstream="127.0.0.1"}'] == 1.0
    )
    assert len(got) == 3  # the 400 (no usage) is neither priced nor unpriced


async def test_an_anthropic_stream_cut_before_its_final_usage_is_priced_on_its_reported_input(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """`message_start` reports the input; a stream that ends before `message_delta` has its output
    counted from the token events. Its cost prices both (a floor of the bill), and the GenAI token
    metric and the span keep the reported input, never the count."""
    from tests.fakes import named, stream_handler

    start = {"type": "message_start", "message": {"id": "m", "model": "claude-sonnet-4-5",
                                                  "usage": {"input_tokens": 1000, "output_tokens": 1}}}  # fmt: skip
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}
    events = [named("message_start", start), *[named("content_block_delta", delta)] * 5]  # no message_delta
    async with start_proxy(prices=str(EXAMPLE)) as p:
        p.serve(stream_handler(events))
        body = {"model": "claude-sonnet-4-5", "stream": True, "max_tokens": 10, "messages": []}
        async with client.post(p.url + "/v1/messages", json=body) as r:
            await r.read()
    (rec,) = p.records
    assert (rec.usage.input_tokens, rec.usage.output_tokens, rec.usage_source) == (1000, 5, "counted")
    assert rec.cost is not None and rec.cost.amount == pytest.approx((1000 * 3.00 + 5 * 15.00) / 1e6, rel=1e-12)
    (root,) = [s for s in p.spans() if s.kind.name == "CLIENT"]
    assert root.attributes["gen_ai.usage.input_tokens"] == 1000
    assert "gen_ai.usage.output_tokens" not in root.attributes  # a count is not billed usage


async def test_no_cost_series_without_a_price_table(start_proxy: ProxyFactory, client: aiohttp.ClientSession) -> None:
    async with start_proxy() as p:
        p.serve(json_handler(_chat("gpt-4o", 10, 0, 10)))
        async with client.post(p.url + "/v1/chat/completions", json={"model": "gpt-4o"}) as r:
            await r.read()
        assert await _metrics(p.metrics_url) == {}
    assert p.records[0].cost is None


def test_serve_stops_at_start_on_a_bad_price_file(tmp_path: Path) -> None:
    from proxy.cli import main

    bad = tmp_path / "p.toml"
    bad.write_text('currency = "USD"\n')
    assert main(["serve", "--port", "0", "--metrics-port", "0", "--prices", str(bad)]) == 2
