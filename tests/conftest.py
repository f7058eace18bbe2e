"""Shared fixtures: a fake upstream on port 0, an in-memory span exporter, a fresh registry,
the real proxy started in-process on port 0 in front of them, and a forward proxy
(`HTTPS_PROXY`) with a throwaway CA for the TLS behind it."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from prometheus_client import CollectorRegistry

from proxy.config.routes import parse_route
from proxy.config.settings import Settings
from proxy.exchange.record import RequestRecord
from proxy.serve import running
from proxy.telemetry.span_pipeline import InMemorySpanExporter, SimpleSpanProcessor
from proxy.telemetry.tracing import Tracing
from tests import tiers
from tests.fakes import FakeUpstream, Handler, OTLPSink, json_handler
from tests.forwardproxy import ForwardProxyServer
from tests.grouped import exported_spans, records_of


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False, help="run the long soak/outage tests")
    parser.addoption(
        "--unit",
        action="store_true",
        default=False,
        help="the unit tier only (make test-fast): deselect e2e tests; a test that starts a process is skipped",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With --unit, modules wholly end-to-end are not even imported (some import big SDKs)."""
    if config.getoption("--unit") and collection_path.suffix == ".py":
        return tiers.whole_module_e2e(collection_path.relative_to(config.rootpath).as_posix()) or None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if tiers.is_e2e(item.nodeid, getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
    if config.getoption("--unit"):
        unit = [i for i in items if "e2e" not in i.keywords and "soak" not in i.keywords]
        kept = {id(i) for i in unit}
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept])
        items[:] = unit
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _unit_tier_starts_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --unit, a test that starts a process is skipped, saying where it belongs (tests/tiers.py)."""
    if request.config.getoption("--unit"):
        tiers.forbid_processes(monkeypatch, request.node.nodeid)


@pytest.fixture
def ca() -> trustme.CA:
    """A throwaway certificate authority: issue upstream certificates, trust it in clients."""
    return trustme.CA()


@pytest.fixture
async def forward() -> AsyncIterator[ForwardProxyServer]:
    """A real forward proxy on port 0 (tests/forwardproxy.py): `upstream.test` is 127.0.0.1 to
    it alone; it refuses `blocked.test` (403)."""
    server = await ForwardProxyServer(hosts={"upstream.test": "127.0.0.1"}, refuse=frozenset({"blocked.test"})).start()
    yield server
    await server.close()


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> Tracing:
    return Tracing(processor=SimpleSpanProcessor(exporter))


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = await FakeUpstream(json_handler({"ok": True})).start()
    yield fake
    await fake.close()


class Proxied:
    """A running proxy in front of `upstream`, with what it recorded.

    `srv` is a `Running` (one process) or, with `proxy_workers` > 1, a `Group` of worker
    processes. A group's workers export their spans themselves, to `sink` (an OTLP receiver:
    `spans` decodes them), and keep their records: `settled` reads them from the group's live
    view (`tests/grouped.py`) and brings the group's metrics up to date first."""

    def __init__(
        self,
        srv: Any,
        upstream: FakeUpstream,
        records: list[RequestRecord],
        exporter: InMemorySpanExporter,
        sink: OTLPSink | None = None,
    ) -> None:
        self.srv = srv
        self.url = srv.proxy_url
        self.metrics_url = srv.metrics_url
        self.upstream = upstream
        self.records = records
        self.exporter = exporter
        self.sink = sink

    @property
    def grouped(self) -> bool:
        """A group of workers (else the proxy in this process)."""
        return self.sink is not None

    def serve(self, handler: Handler) -> None:
        self.upstream.handler = handler

    async def settled(self, count: int, timeout: float = 10.0) -> list[RequestRecord]:
        """The records, once there are `count` of them (a group's: from its live view, its
        metrics brought up to date)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.sink is None:
            while len(self.records) < count and loop.time() < deadline:
                await asyncio.sleep(0.005)
        else:
            async with aiohttp.ClientSession() as session:
                while True:
                    self.records[:] = await records_of(self.metrics_url, session)
                    if len(self.records) >= count or loop.time() >= deadline:
                        break
                    await asyncio.sleep(0.02)
            await self.srv.refresh()
        assert len(self.records) >= count, f"{len(self.records)} records, expected {count}"
        return self.records

    def spans(self, name: str | None = None) -> list[Any]:
        spans = list(self.exporter.get_finished_spans()) if self.sink is None else exported_spans(self.sink.payloads)
        return [s for s in spans if name is None or s.name == name]

    async def settled_spans(self, name: str | None = None, count: int = 1, timeout: float = 10.0) -> list[Any]:
        """The spans once there are `count` named `name`: a group's workers export them a moment
        after the client has its answer."""
        deadline = asyncio.get_running_loop().time() + timeout
        while len(self.spans(name)) < count and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        return self.spans(name)


ProxyFactory = Callable[..., AbstractAsyncContextManager[Proxied]]


@pytest.fixture
def proxy_workers(request: pytest.FixtureRequest) -> int:
    """1: the proxy in this process; N: a group of N workers. A module runs its tests in both
    modes with `pytestmark = pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)`; a
    test that reads what only the proxy's own process has (its log records) is marked
    `@pytest.mark.one_process` and skipped in a group."""
    workers: int = getattr(request, "param", 1)
    if workers != 1 and request.node.get_closest_marker("one_process"):
        pytest.skip("reads the proxy process's own logs; workers have theirs")
    return workers


@pytest.fixture
def start_proxy(
    upstream: FakeUpstream,
    tracing: Tracing,
    registry: CollectorRegistry,
    exporter: InMemorySpanExporter,
    proxy_workers: int,
) -> ProxyFactory:
    """`async with start_proxy(**settings) as p:` — the real proxy on port 0 (or a group of
    `proxy_workers` worker processes and their supervisor)."""

    @asynccontextmanager
    async def factory(**overrides: Any) -> AsyncIterator[Proxied]:
        records: list[RequestRecord] = []
        # A route for / stands in for --upstream (giving both is refused, as `taotrace serve` does).
        root_route = any(parse_route(r).prefix == "" for r in overrides.get("routes", ()))
        given = {} if root_route else {"upstream": upstream.url}
        settings = Settings(
            **{**given, "port": 0, "metrics_port": 0, "drain_seconds": 1.0, "workers": proxy_workers, **overrides}
        )
        if settings.workers > 1:
            from proxy.workers.supervisor import supervising

            sink = await OTLPSink().start()
            # Each worker exports its spans, within 10 ms of their end, to the sink.
            env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_BSP_SCHEDULE_DELAY": "10"}
            try:
                async with supervising(settings, registry=registry, env=env) as group:
                    yield Proxied(group, upstream, records, exporter, sink)
            finally:
                await sink.close()
            return
        async with running(settings, on_record=records.append, tracing=tracing, registry=registry) as srv:
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


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A loopback port whose SYNs are never answered (listen(0), queue filled, never accepted): a
    connect timeout without a network."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(c)
    time.sleep(0.1)
    yield port
    for c in fillers:
        c.close()
    server.close()
