"""A dialect is one module: the proxy learns a new API from one `Dialect` object alone.

A toy dialect defined in `tests/toy_dialect.py`, handed to a real proxy's registry, labels,
names, times and counts its requests; the shipped dialects are each one module of
`proxy/dialects/`, all in the default registry; nothing outside that package names one.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import pkgutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

import proxy.dialects
from proxy.config.settings import Settings
from proxy.dialects import API_OTHER, DIALECTS, Dialect, Dialects
from proxy.exchange.record import RequestRecord
from proxy.serve import Running, running
from proxy.telemetry.span_pipeline import InMemorySpanExporter
from proxy.telemetry.tracing import Tracing
from tests.fakes import FakeUpstream, chat_chunk, json_handler, named, sse, stream_handler
from tests.toy_dialect import TOY

PKG = Path(proxy.dialects.__file__).resolve().parent
# the package's own machinery; every other module in it is one dialect
MACHINERY = {"__init__", "content", "dialect", "reader", "registry", "sse"}

TOY_STREAM = [
    named("heartbeat", {}),
    named("piece", {"piece": "Once"}),
    named("piece", {"piece": ""}),  # an empty piece: a chunk, not a token
    named("piece", {"piece": " upon"}),
    named("heartbeat", {}),
    named("piece", {"piece": " a time"}),
    named("finish", {"reason": "stop", "usage": {"in": 7, "out": 3}}),
]


@asynccontextmanager
async def proxy_with(
    dialects: Dialects,
    upstream: FakeUpstream,
    records: list[RequestRecord],
    tracing: Tracing,
    registry: CollectorRegistry,
) -> AsyncIterator[Running]:
    settings = Settings(upstream=upstream.url, port=0, metrics_port=0, drain_seconds=1.0)
    async with running(
        settings, on_record=records.append, tracing=tracing, registry=registry, dialects=dialects
    ) as srv:
        yield srv


async def test_a_dialect_handed_to_the_registry_labels_times_and_counts_its_requests(
    upstream: FakeUpstream,
    tracing: Tracing,
    registry: CollectorRegistry,
    exporter: InMemorySpanExporter,
    client: aiohttp.ClientSession,
) -> None:
    records: list[RequestRecord] = []
    async with proxy_with(Dialects([*DIALECTS, TOY]), upstream, records, tracing, registry) as srv:
        upstream.handler = stream_handler(TOY_STREAM, gap=0.01)
        body = {"model": "toy-1", "stream": True, "temperature": 0.5, "length": 64, "prompt": "tell me"}
        async with client.post(srv.proxy_url + "/v1/toy/generate", json=body) as r:
            assert r.status == 200 and await r.read() == b"".join(TOY_STREAM)  # bytes untouched
        whole = {"id": "t-9", "model": "toy-1-0613", "text": "hi", "reason": "length", "usage": {"in": 2, "out": 1}}
        upstream.handler = json_handler(whole)
        async with client.post(srv.proxy_url + "/v1/toy/generate", json={"model": "toy-2"}) as r:
            assert await r.json() == whole
        upstream.handler = stream_handler(sse(chat_chunk("hi")))
        async with client.post(srv.proxy_url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
            await r.read()  # the shipped dialects still there beside the toy
        async with aiohttp.ClientSession() as s, s.get(srv.metrics_url + "/metrics") as resp:
            metrics = await resp.text()
    streamed, whole_rec, chat = records
    assert (streamed.api, streamed.operation, streamed.provider, streamed.model) == (
        "toy",
        "generate_content",
        "toy",
        "toy-1",
    )
    # the toy reader's answers reached the phase clock: three tokens, the first of them timed
    t = streamed.timing
    assert t.ttft is not None and t.tpot is not None and len(t.itl) == 2
    assert (streamed.usage.input_tokens, streamed.usage.output_tokens, streamed.usage_source) == (7, 3, "reported")
    assert (whole_rec.api, whole_rec.model, whole_rec.timing.ttft) == ("toy", "toy-2", None)
    assert (whole_rec.usage.input_tokens, whole_rec.usage.output_tokens, whole_rec.usage_source) == (2, 1, "reported")
    assert chat.api == "chat_completions"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    a = spans["generate_content toy-1"].attributes
    assert a is not None
    assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["taotrace.api"]) == (
        "generate_content",
        "toy",
        "toy",
    )
    assert (a["gen_ai.request.temperature"], a["gen_ai.request.max_tokens"]) == (0.5, 64)
    assert a["gen_ai.response.finish_reasons"] == ("stop",) and a["gen_ai.usage.output_tokens"] == 3
    assert a["gen_ai.request.stream"] is True
    assert 'taotrace_requests_total{api="toy",error_type="",model="toy-1",status_code="200"' in metrics
    assert 'taotrace_time_to_first_token_seconds_count{api="toy",model="toy-1"' in metrics
    assert 'taotrace_tokens_total{api="toy",model="toy-1",type="output"' in metrics


async def test_the_registry_given_is_the_only_one_read(
    upstream: FakeUpstream,
    tracing: Tracing,
    registry: CollectorRegistry,
    client: aiohttp.ClientSession,
) -> None:
    records: list[RequestRecord] = []
    async with proxy_with(Dialects([TOY]), upstream, records, tracing, registry) as srv:
        upstream.handler = stream_handler(sse(chat_chunk("hi")))
        async with client.post(srv.proxy_url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
            await r.read()
        upstream.handler = stream_handler(TOY_STREAM)
        async with client.post(srv.proxy_url + "/v1/toy/generate/", json={"model": "m", "stream": True}) as r:
            await r.read()
    chat, toy = records
    assert (chat.api, chat.operation, chat.timing.ttft) == (API_OTHER, None, None)  # not a dialect of this proxy
    assert toy.api == "toy" and toy.timing.ttft is not None


def _dialect_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(PKG)]) if m.name not in MACHINERY)


def test_each_dialect_module_defines_one_dialect_and_the_registry_holds_them_all() -> None:
    found: dict[str, Dialect] = {}
    for name in _dialect_modules():
        module = importlib.import_module(f"proxy.dialects.{name}")
        defined = [v for v in vars(module).values() if isinstance(v, Dialect)]
        assert len(defined) == 1 and module.DIALECT is defined[0], f"proxy/dialects/{name}.py: {defined}"
        found[name] = defined[0]
    assert set(DIALECTS) == set(found.values())  # a dialect module missing from DIALECTS fails here
    assert sorted(d.api for d in DIALECTS) == ["chat_completions", "completions", "embeddings", "messages", "responses"]


def _core_modules() -> list[Path]:
    root = PKG.parent
    return [
        p
        for p in sorted(root.rglob("*.py"))
        if not p.is_relative_to(PKG) and p.relative_to(root).parts[0] not in ("tools", "sim")
    ]


def node_is_sse(node: ast.AST) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "proxy.dialects.sse"


def test_nothing_outside_the_package_names_one_dialect() -> None:
    """So a new dialect needs no edit elsewhere: the proxy's other modules use the generic names
    only, and never compare an `api` label with a dialect's name."""
    generic = {"ANSWER", "NOT_TOKEN", "REASONING", "API_OTHER", "DIALECTS", "Dialect", "Dialects", "RequestInfo", "StreamReader", "Usage", "api_for_path",
               "inspect_request", "is_chunk", "read_body", "reader_for", "request_info"}  # fmt: skip
    labels = {d.api for d in DIALECTS}
    bad = []
    for path in _core_modules():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if node_is_sse(node):
                continue  # the SSE decoder is the stream framing every dialect shares, not a dialect
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("proxy.dialects"):
                bad += [f"{path.name} imports {node.module}.{a.name}" for a in node.names if a.name not in generic]
                if node.module != "proxy.dialects":
                    bad.append(f"{path.name} imports {node.module}")
            elif isinstance(node, ast.Constant) and node.value in labels:
                bad.append(f"{path.name}:{node.lineno} names {node.value!r}")
    assert _core_modules() and not bad, bad


@pytest.mark.parametrize("order", [list(DIALECTS), list(DIALECTS)[::-1]])
def test_the_longest_suffix_wins_whatever_the_order(order: list[Dialect]) -> None:
    dialects = Dialects(order)
    assert dialects.api_for_path("/v1/chat/completions") == "chat_completions"
    assert dialects.api_for_path("/v1/completions/") == "completions"
    assert dialects.api_for_path("/v1/xcompletions") == API_OTHER  # a suffix is whole path segments
    assert dialects.for_path("/v1/models") is None and dialects.get("messages") is not None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (Dialect("toy", "/other/path", "chat", "toy", TOY.reader), "api 'toy'"),
        (Dialect("toy2", "/toy/generate/", "chat", "toy", TOY.reader), "path suffix '/toy/generate'"),
        (Dialect(API_OTHER, "/x", "chat", "toy", TOY.reader), "'other'"),
        (Dialect("toy3", "generate", "chat", "toy", TOY.reader), "starts with '/'"),
    ],
)
def test_a_registry_that_could_not_choose_is_refused(extra: Dialect, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Dialects([TOY, extra])


def test_the_toy_reader_is_pure() -> None:
    """Events in, state out: the same reader the proxy ran, fed by hand."""
    from proxy.dialects.sse import SSEDecoder

    reader = TOY.stream_reader(capture_content=True)
    events = SSEDecoder().feed(b"".join(TOY_STREAM))
    assert [reader.feed(e) for e in events] == [False, True, False, True, False, True, False]
    assert reader.done and reader.text == "Once upon a time" and reader.finish_reasons == ["stop"]
    whole = TOY.read_body(json.dumps({"text": "x", "usage": {"in": 1, "out": 1}}).encode(), capture_content=True)
    assert whole.text == "x" and whole.usage is not None and whole.usage.output_tokens == 1


def test_the_documented_example_is_a_working_dialect() -> None:
    """docs/development.md shows a dialect module whole; it must run and read what it says."""
    from proxy.dialects.sse import SSEDecoder

    doc = (PKG.parent.parent / "docs" / "development.md").read_text()
    section = doc.split("## Adding a dialect", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, object] = {}
    exec(compile(code, "docs/development.md", "exec"), scope)
    example = scope["DIALECT"]
    assert isinstance(example, Dialect)
    dialects = Dialects([*DIALECTS, example])
    assert (
        dialects.for_path("/v1/generate") is example
        and dialects.api_for_path("/v1/chat/completions") == "chat_completions"
    )
    stream = b'event: piece\ndata: {"piece": "a"}\n\nevent: heartbeat\ndata: {}\n\n'
    stream += b'event: finish\ndata: {"reason": "stop", "usage": {"in": 2, "out": 1}}\n\n'
    reader = example.stream_reader()
    assert [reader.feed(e) for e in SSEDecoder().feed(stream)] == [True, False, False]
    assert reader.done and reader.usage is not None and reader.usage.output_tokens == 1
    info = example.inspect(b'{"model": "g-1", "temperature": 0.2}')
    assert (info.api, info.operation, info.provider, info.model, info.params) == (
        "generate",
        "generate_content",
        "example",
        "g-1",
        (("gen_ai.request.temperature", 0.2),),
    )


def test_a_plug_in_reader_s_own_skip_and_capture_limit_hold() -> None:
    """`SKIP` and `MAX_CAPTURE` are a subclass's to set: the base reads them through `self`."""
    from proxy.dialects import StreamReader
    from proxy.dialects.sse import SSEEvent

    class EveryEvent(StreamReader):
        __slots__ = ()
        SKIP = ("noise",)  # any container will do, as in Python
        MAX_CAPTURE = 4

        def _read(self, kind: str, obj: dict[str, Any]) -> bool:
            self._keep(obj.get("text"))
            return True

        def _read_whole(self, obj: dict[str, Any]) -> None:
            self._meta(obj)

    reader = EveryEvent(capture_content=True)
    assert reader.feed(SSEEvent("noise", b'{"text": "not read"}')) == 0  # NOT_TOKEN
    assert reader.feed(SSEEvent("piece", b'{"text": "abcd"}')) is True
    assert reader.feed(SSEEvent("piece", b'{"text": "efgh"}')) is True
    assert reader.text is not None and reader.text.startswith("abcd") and "efgh" not in reader.text


def test_a_plug_in_s_counts_that_are_not_counts_are_dropped_not_raised() -> None:
    """An upstream's `"in": "2"` or `-1` is no token count: `nonneg_int` keeps it out of `Usage`."""
    from proxy.dialects.sse import SSEDecoder

    reader = TOY.stream_reader()
    events = SSEDecoder().feed(b'event: finish\ndata: {"reason": "stop", "usage": {"in": "2", "out": -1}}\n\n')
    assert [reader.feed(e) for e in events] == [False]
    assert reader.done and reader.usage is not None
    assert (reader.usage.input_tokens, reader.usage.output_tokens) == (None, None)


async def test_a_plug_in_that_fails_on_a_request_body_costs_only_its_reading(
    upstream: FakeUpstream,
    tracing: Tracing,
    registry: CollectorRegistry,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A dialect's bug reading a request is logged; the request is forwarded whole and recorded unread."""

    def broken(obj: dict[str, Any]) -> str | None:
        raise ValueError("a plug-in's bug")

    records: list[RequestRecord] = []
    toy = dataclasses.replace(TOY, output_type=broken)
    async with proxy_with(Dialects([*DIALECTS, toy]), upstream, records, tracing, registry) as srv:
        upstream.handler = stream_handler(TOY_STREAM)
        body = b'{"model": "toy-1", "stream": true}'
        async with client.post(srv.proxy_url + "/v1/toy/generate", data=body) as r:
            assert r.status == 200 and await r.read() == b"".join(TOY_STREAM)
        async with aiohttp.ClientSession() as s, s.get(srv.metrics_url + "/metrics") as resp:
            metrics = await resp.text()
    assert upstream.seen[0].body == body
    (record,) = records
    assert (record.api, record.operation, record.model, record.status_code, record.error_type) == (
        "toy",
        "generate_content",
        None,
        200,
        "",
    )
    assert 'taotrace_sink_errors_total{sink="record"} 1.0' in metrics  # counted, and logged once
    assert "the record sink failed" in caplog.text and "ValueError" in caplog.text
