"""Spans: GenAI names and attributes, traceparent continuation and injection upstream."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.trace import SpanKind, StatusCode

from proxy.dialects.content import CONTENT_LIMIT, TRUNCATED
from tests.conftest import Proxied
from tests.fakes import Handler, chat_chunk, chat_stream, json_handler, named, sse, stream_handler, usage_chunk

pytestmark = pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)  # spans built in a supervisor too

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


async def test_traceparent_is_continued_and_upstream_parent_is_ours(
    proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    proxy.serve(stream_handler(chat_stream(3)))
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    async with client.post(
        proxy.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "stream": True}, headers=headers
    ) as r:
        await r.read()
    root = (await proxy.settled_spans("chat gpt-4o-mini"))[-1]
    assert format(root.context.trace_id, "032x") == CLIENT_TRACE
    assert root.parent is not None and format(root.parent.span_id, "016x") == CLIENT_SPAN
    sent = proxy.upstream.seen[-1].headers.getall("traceparent")
    assert len(sent) == 1  # replaced, not duplicated
    version, trace_id, parent_id, _flags = sent[0].split("-")
    assert trace_id == CLIENT_TRACE
    assert parent_id != CLIENT_SPAN  # the client's span would make siblings
    assert parent_id == format(root.context.span_id, "016x")
    assert (await proxy.settled(1))[-1].trace_id == CLIENT_TRACE


async def test_new_trace_without_traceparent(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    async with client.get(proxy.url + "/v1/models") as r:
        await r.read()
    root = (await proxy.settled_spans("GET"))[-1]
    assert root.parent is None
    assert proxy.upstream.seen[-1].headers["traceparent"].split("-")[1] == format(root.context.trace_id, "032x")


async def test_root_span_attributes(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    proxy.serve(stream_handler(chat_stream(4)))
    async with client.post(
        proxy.url + "/v1/chat/completions?api-version=1", json={"model": "gpt-4o-mini", "stream": True}
    ) as r:
        await r.read()
    root = (await proxy.settled_spans("chat gpt-4o-mini"))[-1]
    a = root.attributes
    assert root.kind == SpanKind.CLIENT
    host, port = proxy.upstream.url.removeprefix("http://").split(":")
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == "gpt-4o-mini"
    assert a["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.usage.input_tokens"] == 12 and a["gen_ai.usage.output_tokens"] == 4
    assert a["gen_ai.response.finish_reasons"] == ("stop",)
    assert a["gen_ai.response.id"] == "chatcmpl-1"
    assert a["gen_ai.response.time_to_first_chunk"] > 0
    assert a["taotrace.ttft"] >= a["gen_ai.response.time_to_first_chunk"]
    assert a["server.address"] == host and a["server.port"] == int(port)
    assert a["http.request.method"] == "POST" and a["http.response.status_code"] == 200
    assert a["url.path"] == "/v1/chat/completions"
    assert a["url.full"].endswith("/v1/chat/completions?api-version=REDACTED")
    assert "error.type" not in a
    assert root.status.status_code == StatusCode.UNSET


async def test_anthropic_span_name_and_provider(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    proxy.serve(
        json_handler(
            {"id": "msg", "model": "claude-x", "content": [], "usage": {"input_tokens": 1, "output_tokens": 1}}
        )
    )
    async with client.post(proxy.url + "/v1/messages", json={"model": "claude-x", "max_tokens": 5}) as r:
        await r.read()
    root = (await proxy.settled_spans("chat claude-x"))[-1]
    assert root.attributes["gen_ai.provider.name"] == "anthropic"
    assert [s.name for s in (await proxy.settled_spans()) if s.parent and s.parent.span_id == root.context.span_id] == [
        "network"
    ]


async def test_error_span_has_error_type(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    proxy.serve(json_handler({"error": {"message": "bad key"}}, status=401))
    async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
        await r.read()
    root = (await proxy.settled_spans("chat m"))[-1]
    assert root.attributes["error.type"] == "auth"
    assert root.status.status_code == StatusCode.ERROR


async def test_prompt_text_is_not_recorded_by_default(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    proxy.serve(stream_handler(chat_stream(2)))
    async with client.post(
        proxy.url + "/v1/chat/completions",
        json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "PROMPT-CANARY"}]},
    ) as r:
        await r.read()
    for span in await proxy.settled_spans():
        assert "PROMPT-CANARY" not in repr(dict(span.attributes or {}))


async def test_prompt_capture_is_opt_in(start_proxy, client: aiohttp.ClientSession) -> None:
    async with start_proxy(capture_content=True) as p:
        p.serve(stream_handler(chat_stream(2)))
        async with client.post(
            p.url + "/v1/chat/completions",
            json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "PROMPT-CANARY"}]},
        ) as r:
            await r.read()
        root = (await p.settled_spans("chat m"))[-1]
        assert json.loads(root.attributes["gen_ai.input.messages"]) == [
            {"role": "user", "parts": [{"type": "text", "content": "PROMPT-CANARY"}]}
        ]
        assert json.loads(root.attributes["gen_ai.output.messages"]) == [
            {"role": "assistant", "parts": [{"type": "text", "content": "tok0 tok1 "}], "finish_reason": "stop"}
        ]


async def test_first_chunk_and_first_token_are_apart(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    """The spec's time to first chunk counts the role-only delta; our TTFT waits for text."""
    frames = sse(chat_chunk(role="assistant", content=""), chat_chunk("Hi"), chat_chunk("!"))
    proxy.serve(stream_handler(frames, first_delay=0.05, gap=0.3))
    async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
        await r.read()
    a = (await proxy.settled_spans("chat m"))[-1].attributes
    assert 0.04 < a["gen_ai.response.time_to_first_chunk"] < 0.3
    assert a["taotrace.ttft"] - a["gen_ai.response.time_to_first_chunk"] >= 0.25
    rec = (await proxy.settled(1))[-1]
    assert rec.timing.ttfc == a["gen_ai.response.time_to_first_chunk"] and rec.timing.ttft == a["taotrace.ttft"]
    if not proxy.grouped:  # a group's live view, where its records are read, shows no chunk gaps
        assert len(rec.timing.chunk_gaps) == 2  # three chunks; [DONE] is not one


async def test_request_parameters_and_anthropic_cache_tokens_on_the_span(
    proxy: Proxied, client: aiohttp.ClientSession
) -> None:
    usage = {"input_tokens": 10, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 5, "output_tokens": 1}
    frames = [
        named("message_start", {"type": "message_start", "message": {"id": "msg_9", "model": "claude-x", "usage": usage}}),
        named("ping", {"type": "ping"}),
        named("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        named("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
        named("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    proxy.serve(stream_handler(frames))
    body = {"model": "claude-x", "stream": True, "max_tokens": 64, "temperature": 0.5, "top_k": 5, "messages": []}
    async with client.post(proxy.url + "/v1/messages", json=body) as r:
        await r.read()
    a = (await proxy.settled_spans("chat claude-x"))[-1].attributes
    assert a["gen_ai.request.max_tokens"] == 64 and a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.request.top_k"] == 5.0
    assert a["gen_ai.usage.input_tokens"] == 115  # Anthropic's input excludes the cache; the spec's includes it
    assert a["gen_ai.usage.cache_read.input_tokens"] == 100
    assert a["gen_ai.usage.cache_creation.input_tokens"] == 5
    assert a["gen_ai.usage.output_tokens"] == 3
    assert a["gen_ai.response.id"] == "msg_9" and a["gen_ai.response.finish_reasons"] == ("end_turn",)
    if not proxy.grouped:  # a group's live view, where its records are read, shows no chunk gaps
        assert len(proxy.records[-1].timing.chunk_gaps) == 3  # four chunks: ping is not one


async def test_openai_cached_and_reasoning_tokens_on_the_span(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    frames = sse(chat_chunk("Hi"), chat_chunk(finish="stop"), usage_chunk(40, 9, cached=32, reasoning=6))
    proxy.serve(stream_handler(frames))
    async with client.post(proxy.url + "/v1/chat/completions", json={"model": "o3-mini", "stream": True}) as r:
        await r.read()
    a = (await proxy.settled_spans("chat o3-mini"))[-1].attributes
    assert a["gen_ai.usage.input_tokens"] == 40  # OpenAI's prompt_tokens already include the cached ones
    assert a["gen_ai.usage.cache_read.input_tokens"] == 32
    assert a["gen_ai.usage.reasoning.output_tokens"] == 6
    assert a["gen_ai.usage.output_tokens"] == 9
    assert "gen_ai.usage.cache_creation.input_tokens" not in a  # OpenAI does not report cache writes
    assert not any(
        k.startswith("gen_ai.request.") and k not in ("gen_ai.request.model", "gen_ai.request.stream") for k in a
    )


def _four_dialects() -> Handler:
    """An answer for each parsed dialect, by path: chat and Anthropic streamed, completions and
    Responses whole."""
    chat = stream_handler(chat_stream(2))
    completions = json_handler(
        {"id": "cmpl", "model": "m", "choices": [{"index": 0, "text": "three", "finish_reason": "stop"}]}
    )
    responses = json_handler(
        {"id": "r", "object": "response", "model": "gpt-4o", "status": "completed",
         "output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "fine"}]}]}
    )  # fmt: skip
    messages = stream_handler(
        [
            named("message_start", {"type": "message_start", "message": {"id": "m", "model": "claude-x", "usage": {}}}),
            named("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
            named("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "ok"}}),
            named("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
            named("message_stop", {"type": "message_stop"}),
        ]
    )  # fmt: skip

    async def handler(request: web.Request) -> web.StreamResponse:
        for suffix, answer in (("/chat/completions", chat), ("/completions", completions), ("/responses", responses)):
            if request.path.endswith(suffix):
                return await answer(request)
        return await messages(request)

    return handler


# (path, body, span name, input.value, output.value): the last user message's text, the answer's
IO_CASES = [
    ("/v1/chat/completions",
     {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "system", "content": "be brief"},
                                                           {"role": "user", "content": "first"},
                                                           {"role": "assistant", "content": "yes"},
                                                           {"role": "user", "content": "IO-CANARY second"}]},
     "chat gpt-4o-mini", "IO-CANARY second", "tok0 tok1 "),
    ("/v1/completions", {"model": "m", "prompt": ["one", "IO-CANARY two"]}, "text_completion m", "IO-CANARY two", "three"),
    ("/v1/responses", {"model": "gpt-4o", "instructions": "terse", "input": "IO-CANARY hi"}, "chat gpt-4o", "IO-CANARY hi", "fine"),
    ("/v1/messages",
     {"model": "claude-x", "max_tokens": 5, "stream": True, "system": "be brief",
      "messages": [{"role": "user", "content": [{"type": "text", "text": "IO-CANARY weather?"}]}]},
     "chat claude-x", "IO-CANARY weather?", "ok"),
]  # fmt: skip
IO_NAMES = ("input.value", "input.mime_type", "output.value", "output.mime_type")


async def _send_each(client: aiohttp.ClientSession, url: str) -> None:
    for path, body, *_ in IO_CASES:
        async with client.post(url + path, json=body) as r:
            assert r.status == 200
            await r.read()


async def test_io_values_on_the_root_for_each_dialect(start_proxy, client: aiohttp.ClientSession) -> None:
    """`--capture-io-values`: the plain texts OpenInference viewers list traces by, on the root
    only (built in a supervisor from the workers' records too)."""
    async with start_proxy(capture_content=True, capture_io_values=True) as p:
        p.serve(_four_dialects())
        await _send_each(client, p.url)
        for _path, _body, name, given, answered in IO_CASES:
            (root,) = await p.settled_spans(name)
            a = root.attributes
            assert (a["input.value"], a["input.mime_type"]) == (given, "text/plain"), name
            assert (a["output.value"], a["output.mime_type"]) == (answered, "text/plain"), name
            assert "gen_ai.input.messages" in a and "gen_ai.output.messages" in a  # besides, not instead
        for span in await p.settled_spans():
            if span.parent is not None:  # the phase spans carry none of it
                assert not set(IO_NAMES) & set(span.attributes or {}), span.name
                assert "IO-CANARY" not in repr(dict(span.attributes or {}))


async def test_io_values_are_absent_with_capture_alone(start_proxy, client: aiohttp.ClientSession) -> None:
    async with start_proxy(capture_content=True) as p:  # the GenAI messages, no plain values
        p.serve(_four_dialects())
        await _send_each(client, p.url)
        for _path, _body, name, *_ in IO_CASES:
            (root,) = await p.settled_spans(name)
            assert "gen_ai.input.messages" in root.attributes
            assert not set(IO_NAMES) & set(root.attributes), name


async def test_io_values_are_absent_without_capture(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    proxy.serve(_four_dialects())
    await _send_each(client, proxy.url)
    for _path, _body, name, *_ in IO_CASES:
        assert len(await proxy.settled_spans(name)) == 1, name
    for span in proxy.spans():
        assert not set(IO_NAMES) & set(span.attributes or {}), span.name
        assert "IO-CANARY" not in repr(dict(span.attributes or {}))


async def test_a_long_prompt_is_bounded_in_input_value(start_proxy, client: aiohttp.ClientSession) -> None:
    long = "IO-CANARY " + "x" * (CONTENT_LIMIT + 5000)
    async with start_proxy(capture_content=True, capture_io_values=True) as p:
        p.serve(stream_handler(chat_stream(2)))
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": long}]}
        async with client.post(p.url + "/v1/chat/completions", json=body) as r:
            await r.read()
        (root,) = await p.settled_spans("chat m")
        value = root.attributes["input.value"]
        assert len(value) == CONTENT_LIMIT and value.startswith("IO-CANARY xxx") and value.endswith(TRUNCATED)
