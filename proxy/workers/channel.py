"""The supervisor's channel to one worker: length-prefixed frames over a private socketpair.

The worker speaks first with a `Hello` in JSON, which any version of taotrace can read; the
supervisor answers a Hello of its own version (`messages.VERSION`, `messages.SCHEMA`) with a
`Start`, and refuses any other. From then on every frame is a pickle of one message class of
`proxy.workers.messages`: a few per worker and second (its reports), and one each time /metrics is
scraped or the live view asks. Both ends are this program (the Hello checks it).

Anything else (a frame too long, not JSON, not a pickle, or a pickle of another class) is a
`ChannelError`: the supervisor restarts that worker rather than guess.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import struct

from proxy.workers.messages import SCHEMA, VERSION, Answer, Ask, Hello, Ready, Report, Start, ToSupervisor, ToWorker

__all__ = ["ChannelError", "decode", "decode_frame", "encode", "encode_hello", "mismatch", "receive", "receive_hello"]

_HEADER = struct.Struct("!I")
MAX_FRAME = 256 * 1024 * 1024  # bytes; a report of every series at the label caps is tens of MB at most
MAX_HELLO = 4096


class ChannelError(Exception):
    """A frame that is not a message of ours."""


_MESSAGES = (Start, Ask, Ready, Report, Answer)


def encode(message: ToWorker | ToSupervisor) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def decode(body: bytes) -> ToWorker | ToSupervisor:
    """The message of one frame's body; a `ChannelError` when it is not one of ours."""
    try:
        message = pickle.loads(body)
    except Exception as exc:  # pickle raises many kinds for bytes that are not one
        raise ChannelError(f"not a message ({type(exc).__name__})") from exc
    if not isinstance(message, _MESSAGES):
        raise ChannelError(f"not a message: a {type(message).__name__}")
    return message


def decode_frame(frame: bytes) -> ToWorker | ToSupervisor:
    """The message of one whole frame as `encode` wrote it, its length first (`decode` takes the
    body alone, as `receive` reads it off the socket)."""
    if len(frame) < _HEADER.size or _HEADER.unpack_from(frame)[0] != len(frame) - _HEADER.size:
        raise ChannelError(f"not one whole frame ({len(frame)} bytes)")
    return decode(frame[_HEADER.size :])


def encode_hello(hello: Hello) -> bytes:
    body = json.dumps({"taotrace": hello.version, "schema": hello.schema, "pid": hello.pid}).encode()
    return _HEADER.pack(len(body)) + body


async def _frame(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    try:
        head = await reader.readexactly(_HEADER.size)
        size = _HEADER.unpack(head)[0]
        if size > limit:
            raise ChannelError(f"a frame of {size} bytes (at most {limit})")
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


async def receive(reader: asyncio.StreamReader) -> ToWorker | ToSupervisor | None:
    """The next message, or None when the other end closed."""
    body = await _frame(reader, MAX_FRAME)
    return None if body is None else decode(body)


async def receive_hello(reader: asyncio.StreamReader) -> Hello | None:
    """The worker's Hello, or None when it closed before it said one."""
    body = await _frame(reader, MAX_HELLO)
    if body is None:
        return None
    try:
        said = json.loads(body)
        return Hello(version=str(said["taotrace"]), schema=str(said["schema"]), pid=int(said["pid"]))
    except (ValueError, TypeError, KeyError) as exc:
        raise ChannelError(f"not a hello ({type(exc).__name__})") from None


def mismatch(hello: Hello) -> str | None:
    """Why a worker that said `hello` cannot join this supervisor's group; None when it can."""
    if hello.version == VERSION and hello.schema == SCHEMA:
        return None
    return (
        f"it runs taotrace {hello.version} (messages {hello.schema}), this supervisor {VERSION} (messages {SCHEMA}); "
        "restart the whole group after an upgrade"
    )
