"""Shared fixtures: a fake upstream on port 0, an in-memory span exporter, a fresh registry,
and the real proxy started in-process on port 0 in front of them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from proxy.serve import Running, running
from proxy.settings import Settings
from proxy.timing import RequestRecord
from tests.fakes import FakeUpstream, Handler, json_handler


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False, help="run the long soak/outage tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer_provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = await FakeUpstream(json_handler({"ok": True})).start()
    yield fake
    await fake.close()


class Proxied:
    """A running proxy in front of `upstream`, with what it recorded."""

    def __init__(
        self, srv: Running, upstream: FakeUpstream, records: list[RequestRecord], exporter: InMemorySpanExporter
    ) -> None:
        self.srv = srv
        self.url = srv.proxy_url
        self.metrics_url = srv.metrics_url
        self.upstream = upstream
        self.records = records
        self.exporter = exporter

    def serve(self, handler: Handler) -> None:
        self.upstream.handler = handler

    def spans(self, name: str | None = None) -> list[Any]:
        spans = list(self.exporter.get_finished_spans())
        return [s for s in spans if name is None or s.name == name]


ProxyFactory = Callable[..., AbstractAsyncContextManager[Proxied]]


@pytest.fixture
def start_proxy(
    upstream: FakeUpstream, tracer_provider: TracerProvider, registry: CollectorRegistry, exporter: InMemorySpanExporter
) -> ProxyFactory:
    """`async with start_proxy(**settings) as p:` — the real proxy on port 0."""

    @asynccontextmanager
    async def factory(**overrides: Any) -> AsyncIterator[Proxied]:
        records: list[RequestRecord] = []
        settings = Settings(
            **{"upstream": upstream.url, "port": 0, "metrics_port": 0, "drain_seconds": 1.0, **overrides}
        )
        async with running(
            settings, on_record=records.append, tracer_provider=tracer_provider, registry=registry
        ) as srv:
            yield Proxied(srv, upstream, records, exporter)

    return factory


@pytest.fixture
async def proxy(start_proxy: ProxyFactory) -> AsyncIterator[Proxied]:
    async with start_proxy() as p:
        yield p


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session
