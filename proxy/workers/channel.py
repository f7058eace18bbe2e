"""Messages between the supervisor and a worker: length-prefixed pickles over a socketpair.

Both ends are this program (the supervisor starts the worker and hands it one end of a private
`socket.socketpair()`), so pickle carries frozen `RequestRecord`s as they are: the supervisor
runs the same `Metrics.record` on them as one process would, and a family added there is
aggregated across workers with no change here. Each message is a tuple whose first item names it:

    supervisor -> worker   ("start", settings as a dict, worker index, ship spans?)
                           ("in_flight?", ask number, request id or None)   the live view polls
    worker -> supervisor   ("ready",)
                           ("records", [RequestRecord, ...], {(upstream, api): requests in flight})
                           ("in_flight", ask number, [InFlight, ...])       the answer
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

__all__ = ["encode", "receive"]

_HEADER = struct.Struct("!I")


def encode(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


async def receive(reader: asyncio.StreamReader) -> tuple[Any, ...] | None:
    """The next message, or None when the other end closed."""
    try:
        head = await reader.readexactly(_HEADER.size)
        body = await reader.readexactly(_HEADER.unpack(head)[0])
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    message = pickle.loads(body)
    assert isinstance(message, tuple)
    return message
