"""`taotrace sim`: build the simulator from its settings and serve it until interrupted."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

from aiohttp import web

from proxy.sim.app import create_app
from proxy.sim.catalogue import DEFAULT_CATALOGUE, ModelSpec, catalogue_from
from proxy.sim.settings import SimSettings
from proxy.sim.tokens import load_tokenizer

__all__ = ["build_app", "load_catalogue", "run", "serve"]


def load_catalogue(path: str | None) -> tuple[ModelSpec, ...]:
    if path is None:
        return DEFAULT_CATALOGUE
    return catalogue_from(json.loads(Path(path).read_text()))


def build_app(settings: SimSettings) -> web.Application:
    return create_app(settings, load_catalogue(settings.catalogue), load_tokenizer(settings.tokenizer))


async def serve(settings: SimSettings, stop: asyncio.Event) -> None:
    runner = web.AppRunner(build_app(settings), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else settings.port
    print(f"taotrace sim: http://{settings.host}:{port}/v1 (time_scale {settings.time_scale})", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run(settings: SimSettings) -> int:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    asyncio.run(main())
    return 0
