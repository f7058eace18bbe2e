"""The official SDKs, unmodified, streaming through the proxy: only `base_url` changes."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.conftest import Proxied
from tests.fakes import chat_stream, messages_stream, responses_stream, sse, stream_handler

pytestmark = pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)  # one process, and --workers 2

KEY = "sk-test-not-a-real-key"


@pytest.fixture
def oai(proxy: Proxied) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0)


async def test_openai_chat_stream(proxy: Proxied, oai: openai.AsyncOpenAI) -> None:
    proxy.serve(stream_handler(chat_stream(6), gap=0.005))
    text = ""
    usage = None
    stream = await oai.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == "".join(f"tok{i} " for i in range(6))
    assert usage is not None and usage.completion_tokens == 6
    assert proxy.upstream.seen[-1].headers["Authorization"] == f"Bearer {KEY}"
    rec = (await proxy.settled(1))[-1]
    assert (rec.api, rec.model, rec.timing.token_events, rec.error_type) == ("chat_completions", "gpt-4o-mini", 6, "")
    root = (await proxy.settled_spans("chat gpt-4o-mini"))[-1]  # built in the supervisor with workers
    assert root.attributes["gen_ai.usage.output_tokens"] == 6 and root.attributes["taotrace.ttft"] > 0
    assert format(root.context.trace_id, "032x") == rec.trace_id


async def test_openai_legacy_completions_stream(proxy: Proxied, oai: openai.AsyncOpenAI) -> None:
    chunks = [
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "gpt-3.5-turbo-instruct",
            "choices": [{"text": w, "index": 0, "logprobs": None, "finish_reason": None}],
        }
        for w in ["a", "b", "c"]
    ]
    proxy.serve(stream_handler(sse(*chunks)))
    stream = await oai.completions.create(model="gpt-3.5-turbo-instruct", prompt="x", stream=True)
    text = "".join([c.choices[0].text async for c in stream])
    assert text == "abc"
    rec = (await proxy.settled(1))[-1]
    assert rec.api == "completions" and rec.timing.token_events == 3


async def test_openai_responses_stream(proxy: Proxied, oai: openai.AsyncOpenAI) -> None:
    proxy.serve(stream_handler(responses_stream(), gap=0.005))
    stream = await oai.responses.create(model="gpt-4o-mini", input="hi", stream=True)
    deltas = []
    final = None
    async for event in stream:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type == "response.completed":
            final = event.response
    assert "".join(deltas) == "Hello from the proxy"
    assert final is not None and final.usage is not None and final.usage.output_tokens == 4
    rec = (await proxy.settled(1))[-1]
    assert (rec.api, rec.timing.token_events, rec.usage.input_tokens, rec.response_id) == ("responses", 4, 9, "resp_1")


async def test_anthropic_messages_stream(proxy: Proxied) -> None:
    proxy.serve(stream_handler(messages_stream(), gap=0.005))
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    async with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "Hello there!"
    assert final.usage.output_tokens == 3
    seen = proxy.upstream.seen[-1].headers  # SDK versions differ: x-api-key or a bearer token
    assert KEY in (seen.get("x-api-key"), seen.get("Authorization", "").removeprefix("Bearer "))
    rec = (await proxy.settled(1))[-1]
    assert (rec.api, rec.timing.token_events, rec.usage.input_tokens, rec.usage.cached_input_tokens) == (
        "messages",
        3,
        28,
        8,
    )
    assert rec.finish_reasons == ("end_turn",)


async def test_openai_sdk_sees_upstream_errors_unchanged(proxy: Proxied, oai: openai.AsyncOpenAI) -> None:
    from tests.fakes import json_handler

    proxy.serve(
        json_handler(
            {
                "error": {
                    "message": "Incorrect API key provided",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
            status=401,
        )
    )
    with pytest.raises(openai.AuthenticationError) as info:
        await oai.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert info.value.code == "invalid_api_key"
