"""How one of our own failures is logged: where it was raised, never what it says."""

from __future__ import annotations

import traceback

__all__ = ["stack_of"]


def stack_of(exc: BaseException) -> str:
    """The exception's type and the stack it was raised through, without its message: a message
    can quote data (a prompt, a header, a body) that must never reach a log."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    return f"{type(exc).__module__}.{type(exc).__qualname__} (message withheld)\n{frames}".rstrip()
