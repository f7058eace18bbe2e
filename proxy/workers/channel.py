"""The supervisor's channel to one worker: length-prefixed frames over a private socketpair.

The worker speaks first with a `Hello` in JSON, which any version of taotrace can read; the
supervisor answers a Hello of its own version (`messages.VERSION`, `messages.SCHEMA`) with a
`Start`, and refuses any other. From then on every frame is one message class of
`proxy.workers.messages`, its first byte saying how it is written:

    R  Records: `marshal` of plain tuples (`plain.py`: each record's fields in order), the
       traffic of the channel, where a pickle's dataclass states cost the supervisor most (with
       several workers, a long stream's per-token series binned: `binning.py`)
    P  any other message: a pickle (a few per worker, or one each time the live view asks)

Both ends are this program, so a `RequestRecord` arrives as the worker built it and the
supervisor runs the same `Metrics.record` on it as one process would.

Anything else (a frame too long, not JSON, of another kind, not a marshal of records or not a
pickle, or a pickle of another class) is a `ChannelError`: the supervisor restarts that worker rather than guess.
"""

from __future__ import annotations

import asyncio
import json
import marshal
import pickle
import struct

from proxy.workers.messages import (
    SCHEMA,
    VERSION,
    AskInFlight,
    Hello,
    InFlightAnswer,
    Ready,
    Records,
    Start,
    ToSupervisor,
    ToWorker,
    record_form,
)

__all__ = ["ChannelError", "decode", "decode_frame", "encode", "encode_hello", "mismatch", "receive", "receive_hello"]

_HEADER = struct.Struct("!I")
MAX_FRAME = 256 * 1024 * 1024  # bytes; a batch of records is a few MB at most
MAX_HELLO = 4096


class ChannelError(Exception):
    """A frame that is not a message of ours."""


_RECORDS, _PICKLE = b"R", b"P"
# marshal's current format: it writes a string seen before as a reference, and the same words
# ("chat_completions", the model, attribute names) recur in every record of a batch
_MARSHAL_VERSION = 4


def encode(message: ToWorker | ToSupervisor) -> bytes:
    if isinstance(message, Records):
        encode_record = record_form.encode
        plain = (
            [encode_record(rec) for rec in message.records],
            message.in_flight,
            message.dropped,
            message.sink_errors,
            message.mirror_dropped,
        )
        body = _RECORDS + marshal.dumps(plain, _MARSHAL_VERSION)
    else:
        body = _PICKLE + pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def decode(body: bytes) -> ToWorker | ToSupervisor:
    """The message of one frame's body; a `ChannelError` when it is not one of ours."""
    kind, rest = body[:1], memoryview(body)[1:]
    if kind == _RECORDS:
        try:
            records, in_flight, dropped, sink_errors, mirror_dropped = marshal.loads(rest)
            decode_record = record_form.decode
            return Records([decode_record(rec) for rec in records], in_flight, dropped, sink_errors, mirror_dropped)
        except Exception as exc:  # marshal and a shape that is not a record's raise several kinds
            raise ChannelError(f"not a message of records ({type(exc).__name__})") from exc
    if kind != _PICKLE:
        raise ChannelError(f"not a message: a frame of kind {bytes(kind)!r}")
    try:
        message = pickle.loads(rest)
    except Exception as exc:  # pickle raises many kinds for bytes that are not one
        raise ChannelError(f"not a message ({type(exc).__name__})") from exc
    if not isinstance(message, (Start, AskInFlight, Ready, InFlightAnswer)):  # Records arrive as R
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
        f"it runs taotrace {hello.version} (records {hello.schema}), this supervisor {VERSION} (records {SCHEMA}); "
        "restart the whole group after an upgrade"
    )
