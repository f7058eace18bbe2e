"""Ctrl-C for the client tools (demo, probe, doctor): the first SIGINT or SIGTERM stops the work
in progress and the command reports what it finished, instead of a `KeyboardInterrupt`
traceback that loses it. Signals as `proxy.server.lifecycle.Shutdown` takes them (a third ends the
process on the spot)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from contextlib import suppress
from typing import TypeVar

from proxy.server.lifecycle import Shutdown

__all__ = ["interrupted_status", "signals", "unless_stopped"]

T = TypeVar("T")


def signals() -> Shutdown | None:
    """SIGINT and SIGTERM taken on the running loop; None off the main thread, where Python lets
    no one take signals (a command run from a thread by a test or a host program)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return Shutdown().install()


def interrupted_status(shutdown: Shutdown | None) -> int:
    """The exit status of a command a signal stopped: 130 for SIGINT, 143 for SIGTERM."""
    return shutdown.exit_status if shutdown is not None else 130


async def unless_stopped(work: Awaitable[T], shutdown: Shutdown | None) -> T | None:
    """`work`'s result, or None when a signal came first (then `work` is cancelled and awaited)."""
    if shutdown is None:
        return await work
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(shutdown.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task
    return None
