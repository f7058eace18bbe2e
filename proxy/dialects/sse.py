"""A sans-IO Server-Sent Events decoder: bytes in, events out (WHATWG HTML, "Parsing an event stream").

Lines end in CRLF, LF or CR, and a CR that ends one read may have its LF at the start of the
next. Comments (`:`) and unknown fields are ignored, `data:` lines join with `\\n`, one space
after the colon is dropped, a leading BOM is dropped. Memory is bounded: a line or an event
larger than `max_event_bytes` is skipped (the bytes still reach the client; only parsing gives up).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEEvent", "DEFAULT_MAX_EVENT_BYTES"]

DEFAULT_MAX_EVENT_BYTES = 1 << 20
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: its type (`message` when none was named) and its raw data bytes."""

    event: str
    data: bytes
    id: str | None = None


class SSEDecoder:
    """Feed it the bytes of a `text/event-stream` as they arrive; it returns complete events."""

    __slots__ = (
        "_tail", "_held", "_skip_line", "_skip_lf", "_started", "_event", "_data", "_size", "_id", "_oversized", "_max",
    )  # fmt: skip

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        # An incomplete last line, kept as parts and joined only once its end arrives: a long
        # line read in small pieces must cost linear time, not a re-copy of itself per read.
        self._tail: list[bytes] = []
        self._held = 0  # bytes in _tail
        self._skip_line = False  # the current line went over the cap: drop it up to its end
        self._skip_lf = False  # the previous read ended in CR: an LF at the start of this one is its pair
        self._started = False  # the BOM check is done
        self._event = ""
        self._data: list[bytes] = []
        self._size = 0
        self._id: str | None = None
        self._oversized = False  # the current line or event went over the cap: drop it whole

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode one read. Returns the events it completed (often none, often one)."""
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if (
            chunk[-2:] == b"\n\n"
            and self._started
            and not self._tail
            and not self._skip_line
            and not self._data
            and not self._event
            and not self._oversized
            and b"\r" not in chunk
        ):
            simple = self._simple(chunk)
            if simple is not None:
                return simple
        if b"\r" in chunk:
            self._skip_lf = chunk[-1:] == b"\r"
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._skip_line:
            end = chunk.find(b"\n")
            if end < 0:
                return []
            self._skip_line = False
            chunk = chunk[end + 1 :]
        if self._tail:
            if b"\n" not in chunk and self._started:
                self._hold(chunk)
                return []
            chunk = b"".join(self._tail) + chunk
            self._tail = []
            self._held = 0
        if not self._started:
            if len(chunk) < 3 and _BOM.startswith(chunk):
                self._hold(chunk)  # could still be the start of a BOM
                return []
            self._started = True
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        lines = chunk.split(b"\n")
        self._hold(lines.pop())
        events: list[SSEEvent] = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def _simple(self, chunk: bytes) -> list[SSEEvent] | None:
        """The common read, decoded without the line machinery; None when it is not that read.

        Upstreams send one or more whole `data: {...}` events per read, each a single line
        followed by a blank line. Anything else (comments, `event:`/`id:` fields, multi-line
        data, a partial or oversized event) returns None and takes the general path, which
        yields the same events for these reads, only slower.
        """
        blocks = chunk.split(b"\n\n")
        if blocks.pop():  # the read does not end exactly on a blank line
            return None
        events = []
        for block in blocks:
            if block[:5] != b"data:" or b"\n" in block:
                return None
            value = block[6:] if block[5:6] == b" " else block[5:]
            if len(value) >= self._max:  # the general path's cap: len + 1 > max
                return None
            events.append(SSEEvent("message", value, self._id))
        return events

    def flush(self) -> list[SSEEvent]:
        """End of stream. Per the spec, an event not ended by a blank line is discarded."""
        self._tail = []
        self._held = 0
        self._skip_line = False
        self._reset()
        return []

    def _hold(self, part: bytes) -> None:
        """Keep the start of an unfinished line, unless the line is over the cap."""
        if not part:
            return
        self._held += len(part)
        if self._held > self._max:
            self._tail = []
            self._held = 0
            self._skip_line = True
            self._oversized = True  # the event this line belongs to is dropped whole
            self._data = []
        else:
            self._tail.append(part)

    def _reset(self) -> None:
        self._event = ""
        self._data = []
        self._size = 0
        self._oversized = False

    def _line(self, line: bytes) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if self._oversized or line[0] == 0x3A:  # ":" comment
            return None
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name = line[:colon]
            value = line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if name == b"data":
            self._size += len(value) + 1
            if self._size > self._max:
                self._oversized = True
                self._data = []
            else:
                self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\x00" not in value:
                self._id = value.decode("utf-8", "replace")
        return None

    def _dispatch(self) -> SSEEvent | None:
        if self._oversized or not self._data:
            self._reset()
            return None
        data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        event = SSEEvent(self._event or "message", data, self._id)
        self._reset()
        return event
