"""What every dialect's writer shares: usage numbers, response identity, SSE framing.

A writer is sans-IO: it turns "the request was admitted", "token i", "the end" and "an error"
into the exact bytes a provider sends; the aiohttp handler decides when to write them.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.sim.errors import SimError
from proxy.sim.text import Output

__all__ = ["Meta", "SimUsage", "Writer", "data_line", "named_event", "new_id"]

_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str, length: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def data_line(obj: Any) -> bytes:
    """`data: {json}` + blank line: the OpenAI chat/completions framing."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def named_event(kind: str, obj: Any) -> bytes:
    """`event: kind` + `data: {json}` + blank line: Responses and Anthropic framing."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


@dataclass(frozen=True, slots=True)
class SimUsage:
    """Token counts of one request. `input_tokens` includes the cached ones (OpenAI's way)."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int


@dataclass(frozen=True, slots=True)
class Meta:
    """Identity of one response and what the request asked for that shows in it."""

    id: str
    model: str
    created: int
    output: Output
    include_usage: bool = False
    max_tokens: int | None = None


class Writer(Protocol):
    """One response in one dialect."""

    meta: Meta

    def start(self, usage: SimUsage) -> bytes: ...

    def token(self, index: int) -> bytes: ...

    def end(self, usage: SimUsage) -> bytes: ...

    def error(self, error: SimError) -> bytes: ...

    def interrupted(self) -> bytes:
        """What an engine that stops a generation early sends before it ends the body cleanly
        (no finish reason, no final event)."""
        ...

    def body(self, usage: SimUsage) -> dict[str, Any]: ...
