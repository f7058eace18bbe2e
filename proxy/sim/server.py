"""`taotrace sim`: build the simulator from its settings and serve it until interrupted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from proxy.lifecycle import run_loop, stop_signalled
from proxy.sim.app import SIMULATOR, Simulator, create_app
from proxy.sim.catalogue import DEFAULT_CATALOGUE, ModelSpec, catalogue_from
from proxy.sim.settings import SimSettings
from proxy.sim.tokens import load_tokenizer

__all__ = ["SimRunning", "build_app", "load_catalogue", "run", "running"]


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
async def running(settings: SimSettings) -> AsyncIterator[SimRunning]:
    """Serve the simulator (port 0 allowed) for the duration of the block."""
    app = build_app(settings)
    # a client that leaves cancels its handler, which frees its batch slot and KV blocks
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, settings.port).start()
        host, port = runner.addresses[0][:2]
        yield SimRunning(f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}", app[SIMULATOR])
    finally:
        await runner.cleanup()


def run(settings: SimSettings) -> int:
    """The `taotrace sim` command: serve until SIGINT or SIGTERM."""

    async def main() -> None:
        async with running(settings) as sim:
            print(
                f"taotrace sim: {sim.base_url} (time_scale {settings.time_scale}); stats at {sim.url}/sim/stats",
                flush=True,
            )
            await stop_signalled()

    try:
        run_loop(main())
    except OSError as exc:
        print(f"taotrace sim: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}")
        return 1
    return 0
