"""Process lifetime shared by the long-running commands (serve, sim, demo): which event loop
runs them, and waiting for SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from contextlib import suppress
from typing import Any, TypeVar

__all__ = ["run_loop", "stop_signalled"]

T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on uvloop where it is installed (less per-chunk overhead), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - not on every platform
        return asyncio.run(main)
    return uvloop.run(main)


async def stop_signalled() -> None:
    """Return when the process receives SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
