"""`taotrace sim`: build the simulator from its settings and serve it until interrupted."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from proxy.server.lifecycle import Drained, Shutdown, drain, run_loop
from proxy.server.listen import CannotListen, bind
from proxy.sim.app import SIMULATOR, Simulator, create_app
from proxy.sim.catalogue import DEFAULT_CATALOGUE, ModelSpec, catalogue_from
from proxy.sim.settings import SimSettings
from proxy.sim.tokens import load_tokenizer

__all__ = ["SimRunning", "build_app", "load_catalogue", "run", "running"]

DRAIN_SECONDS = 1.0  # streams in flight at a stop get this long; a second signal cuts them at once


@dataclass(frozen=True)
class SimRunning:
    """A started simulator: its root URL (`url + "/v1"` is the OpenAI base URL) and its state."""

    url: str
    simulator: Simulator

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


def load_catalogue(path: str | None) -> tuple[ModelSpec, ...]:
    if path is None:
        return DEFAULT_CATALOGUE
    return catalogue_from(json.loads(Path(path).read_text()))


def build_app(settings: SimSettings) -> web.Application:
    return create_app(settings, load_catalogue(settings.catalogue), load_tokenizer(settings.tokenizer))


@asynccontextmanager
async def running(
    settings: SimSettings,
    *,
    stop_now: asyncio.Event | None = None,
    on_drained: Callable[[Drained], None] | None = None,
) -> AsyncIterator[SimRunning]:
    """Serve the simulator (port 0 allowed) for the duration of the block; then stop listening,
    give requests in flight `DRAIN_SECONDS` (none once `stop_now` is set) and cut the rest."""
    app = build_app(settings)
    in_flight: set[asyncio.Task[Any]] = set()

    @web.middleware
    async def tracked(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        in_flight.add(task)
        try:
            return await handler(request)
        finally:
            in_flight.discard(task)

    app.middlewares.append(tracked)
    # a client that leaves cancels its handler, which frees its batch slot and KV blocks
    socks = bind(settings.host, settings.port, port_flag="--port", host_flag="--host")
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=DRAIN_SECONDS)
    await runner.setup()
    try:
        for sock in socks:
            await web.SockSite(runner, sock).start()
        host, port = runner.addresses[0][:2]
        yield SimRunning(f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}", app[SIMULATOR])
    finally:
        for site in list(runner.sites):
            await site.stop()
        drained = await drain(in_flight, DRAIN_SECONDS, stop_now)
        if on_drained is not None:
            on_drained(drained)
        await runner.cleanup()
        for sock in socks:
            sock.close()


def run(settings: SimSettings) -> int:
    """The `taotrace sim` command: serve until SIGINT or SIGTERM."""

    def drained(result: Drained) -> None:
        print(f"taotrace sim: stopped; {result.describe(DRAIN_SECONDS)}", flush=True)

    async def main() -> None:
        shutdown = Shutdown().install()
        async with running(settings, stop_now=shutdown.now, on_drained=drained) as sim:
            print(
                f"taotrace sim: {sim.base_url} (time_scale {settings.time_scale}); stats at {sim.url}/sim/stats",
                flush=True,
            )
            await shutdown.wait()

    try:
        run_loop(main())
    except CannotListen as exc:  # the same line as serve and demo say
        print(f"taotrace sim: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"taotrace sim: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
