"""The relay of an upstream's answer to the client, read by read, and how a relay ended.

Bytes go to the client first: each read from the upstream is written to the client inside the
upstream connection's `data_received` (`proxy/upstream/`), then timestamped and parsed on the
same immutable bytes; parsing can never fail the request. The upstream dying mid-body closes the
client's connection without the terminating chunk, so a cut stream never looks complete.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from proxy.dialects import Dialect, StreamReader, is_chunk
from proxy.dialects.sse import SSEDecoder
from proxy.errors import BodyFailure
from proxy.exchange.outcome import End
from proxy.exchange.timing import PhaseClock
from proxy.logs.stack import stack_of
from proxy.upstream import UpstreamResponse
from proxy.upstream.tcpinfo import TcpInfo

__all__ = [
    "MAX_BODY_COPY", "ClientGone", "Discard", "Relay", "cut_client", "ended_by", "never_paused", "parsers", "relay_for",
    "relay_to_client",
]  # fmt: skip

log = logging.getLogger("taotrace")

Clock = Callable[[], float]

MAX_BODY_COPY = 4 << 20  # a non-streaming body is kept (for its usage) up to this size
MAX_ERROR_COPY = 64 << 10
HIGH_WATER = 256 << 10  # client send buffer above this: stop reading the upstream until it drains
LOW_WATER = 64 << 10
DRAIN_POLL = 0.005


class ClientGone(Exception):
    """A read came after the client had left."""


def parsers(
    dialect: Dialect | None, resp: UpstreamResponse, capture_content: bool
) -> tuple[SSEDecoder | None, StreamReader | None, bytearray | None]:
    """What to run on the copy of an answer: an SSE decoder + the dialect's reader, or a bounded
    copy of the body (whole answers and errors), or nothing (compressed, or not the dialect's)."""
    encoding = resp.content_encoding
    if encoding is not None and encoding.lower() != "identity":
        return None, None, None  # compressed: forwarded untouched, not parsed
    ctype = (resp.content_type or "").lower()
    if ctype.startswith("text/event-stream") and dialect is not None:
        return SSEDecoder(), dialect.stream_reader(capture_content), None
    if resp.status >= 400 or (dialect is not None and "json" in ctype):
        return None, None, bytearray()
    return None, None, None


class Discard(asyncio.Transport):
    """Where a mirror copy's answer is "written": nowhere. The relay times and parses it as it
    would a client's, so both records of a pair are measured the same way."""

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def writelines(self, list_of_data: object) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def never_paused() -> None:
    return None


class Relay:
    """The per-request sink: write one upstream read to the client, then time and parse it.

    Runs inside the upstream protocol's `data_received`, so nothing is queued between the two
    sockets. Returns True when the client's send buffer is over the high-water mark.

    `start` sends the response head with the body bytes read with the upstream's head, in one
    send (one wake-up of the client instead of two), or alone at once when none came with it.
    The final chunk is not joined to the read that ends the body: the client then had its end
    before the proxy's bookkeeping of the request, and a burst of streams sent its next burst
    into that bookkeeping, adding to its TTFT (docs/performance.md).
    """

    __slots__ = (
        "cap", "chunked", "clock", "copy", "decoder", "failure", "lost", "phase", "reader", "relayed", "t_written",
        "tcp_first", "tcp_probe", "transport", "writer",
    )  # fmt: skip

    def __init__(
        self,
        transport: asyncio.Transport | None,
        chunked: bool,
        clock: Clock,
        phase: PhaseClock,
        decoder: SSEDecoder | None,
        reader: StreamReader | None,
        copy: bytearray | None,
        cap: int,
        tcp_probe: Callable[[], TcpInfo | None] | None = None,
    ) -> None:
        self.transport = transport
        self.chunked = chunked
        self.clock = clock
        self.phase = phase
        self.decoder = decoder
        self.reader = reader
        self.copy = copy
        self.cap = cap
        self.t_written: float | None = None  # when the last read was written to the client
        self.lost = False  # a read came after the client left, unwritten
        self.failure: Exception | None = None  # our own code failed on a read (a bug, not the client)
        self.relayed = phase.relay
        self.tcp_probe = tcp_probe  # reads TCP_INFO once, at the first token
        self.tcp_first: TcpInfo | None = None
        self.writer: AbstractStreamWriter | None = None  # aiohttp's writer of the response, after `start`

    @property
    def stream_error(self) -> bool:
        """The stream itself reported an error (a chat `{"error": ...}` chunk, an `event: error`,
        `response.failed`): a client leaving after it is not an abort."""
        reader = self.reader
        return reader is not None and bool(reader.error_type)

    @property
    def done(self) -> bool:
        """The stream's terminal event was written to the client: it has the whole answer."""
        reader = self.reader
        return reader is not None and reader.done

    @property
    def unfinished(self) -> bool:
        """A parsed stream without its dialect's defined end so far (`StreamReader.complete`)."""
        reader = self.reader
        return reader is not None and not reader.complete

    async def start(self, writer: AbstractStreamWriter, first: bytes, whole: bool) -> None:
        """Send the response head, which aiohttp holds (`RelayedResponse`): with `first`, the
        body bytes read with the upstream's head, in one write (with the body's end too when
        `whole`), or alone, at once, when none came with it."""
        self.writer = writer
        t = self.clock()
        transport = self.transport
        if transport is None or transport.is_closing():
            self.lost = True
            raise ClientGone
        if not first:
            writer.send_headers()
            return
        if whole:
            await writer.write_eof(first)
        else:
            await writer.write(first)
        try:
            self._written(chunk=first, t=t, transport=transport)
        except Exception as exc:  # noqa: BLE001 - our own code failed: logged, and the request is internal_error
            self._failed(exc)

    def __call__(self, chunk: bytes) -> bool:
        try:
            t = self.clock()
            transport = self.transport
            if transport is None or transport.is_closing():
                if self.done:
                    return False  # gone after the end: what follows is dropped until discard_rest takes over
                self.lost = True
                raise ClientGone
            if not self.chunked:
                transport.write(chunk)
            elif len(chunk) < 16384:
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))  # one small copy, one send
            else:
                transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
            return self._written(chunk, t, transport)
        except ClientGone:
            raise
        except Exception as exc:  # noqa: BLE001 - our own code failed: logged, and the request is internal_error
            self._failed(exc)
            return False

    def _written(self, chunk: bytes, t: float, transport: asyncio.Transport) -> bool:
        """`chunk` went to the client at `t`: time and parse it; True when the client's buffer is full."""
        self.t_written = t
        self.relayed.append(self.clock() - t)  # the proxy's relay cost for this read
        phase = self.phase
        if phase.t_first_byte is None:
            phase.body_bytes(t)
        reader = self.reader
        if reader is not None:
            try:
                for event in self.decoder.feed(chunk):  # type: ignore[union-attr]
                    if is_chunk(event):
                        phase.chunk(t)
                    kind = reader.feed(event)
                    if kind:
                        phase.token(t, kind)
            except Exception:  # parsing is best effort, forwarding is not
                log.debug("stream parse failed; timing for this request is partial", exc_info=True)
                self.reader = None
            if self.tcp_probe is not None and phase.t_first is not None:
                self.tcp_first = self.tcp_probe()  # once per request, after the bytes went out
                self.tcp_probe = None
        elif self.copy is not None and len(self.copy) < self.cap:
            self.copy += chunk
        return transport.get_write_buffer_size() > HIGH_WATER

    def _failed(self, exc: Exception) -> None:
        """Our own code failed on a read (a bug, never the client's doing): log it, and cut the
        client's connection as when it leaves; the next read then stops the upstream's."""
        log.error("internal error while relaying a response; its connection is closed:\n%s", stack_of(exc))
        self.failure = exc
        transport, self.transport = self.transport, None
        if transport is not None:
            try:
                transport.close()  # what was written is flushed, then FIN: no terminating chunk
            except Exception:  # noqa: BLE001 - a transport that cannot close (a mirror's) is dropped anyway
                pass


def cut_client(request: web.BaseRequest) -> None:
    """End the client's connection without the final chunk: a cut stream must look cut."""
    transport = request.transport
    if transport is not None:
        transport.close()  # flushes what was written, then FIN; write_eof then fails quietly


def ended_by(relay: Relay, exc: Exception) -> End:
    """How a relay that raised `exc` ended. The upstream connection wraps what the relay's sink
    raises; the relay itself knows whether that was the client leaving or our own code failing."""
    if relay.failure is not None:
        return "internal"  # logged by the relay as it failed
    if relay.lost:
        return "client_left"
    if isinstance(exc, BodyFailure):
        return "timeout" if exc.error_type == "timeout" else "stream_cut"
    # Our own code failed outside the sink (the upstream client's): a bug, never the client's doing.
    log.error("internal error while relaying a response; its connection is closed:\n%s", stack_of(exc))
    return "internal"


async def relay_to_client(
    relay: Relay,
    upstream: UpstreamResponse,
    request: web.BaseRequest,
    response: web.StreamResponse,
    writer: AbstractStreamWriter,
    on_cut: Callable[[BodyFailure], None] | None = None,
) -> End:
    """Send the head, relay the body to its end; returns how it ended. `on_cut`: told of an
    upstream that failed mid-body before the answer's end."""
    transport = request.transport

    async def drained() -> None:
        # aiohttp has no public "wait until the client drained" for raw writes; a slow
        # client is the rare case, so a short poll costs nothing on the hot path.
        while transport is not None and not transport.is_closing() and transport.get_write_buffer_size() > LOW_WATER:
            await asyncio.sleep(DRAIN_POLL)

    try:
        await relay.start(writer, upstream.take_read(), upstream.complete)
        await upstream.relay(relay, drained)
    except Exception as exc:  # noqa: BLE001 - noted as how it ended (and logged when it is ours)
        end = ended_by(relay, exc)
        if end == "client_left" or end == "internal":
            if transport is not None:
                transport.close()  # what was written is flushed, then FIN
        else:
            cut_client(request)  # transparent: the client sees the cut it would have seen upstream
            if not relay.done and on_cut is not None and isinstance(exc, BodyFailure):
                on_cut(exc)
        return end
    if relay.failure is not None:
        return "internal"  # on the last read: the client's connection is already cut
    try:  # at once: the end of a response never waits for anyone's bookkeeping
        await response.write_eof()
    except ConnectionError:  # the client left after the whole body: nothing was lost
        return "client_left"
    return "complete"


def relay_for(
    transport: asyncio.Transport | None,
    chunked: bool,
    clock: Clock,
    phase: PhaseClock,
    dialect: Dialect | None,
    upstream: UpstreamResponse,
    capture_content: bool,
) -> Relay:
    """The relay of `upstream`'s answer to `transport`, with what to run on its copy (`parsers`)."""
    decoder, reader, copy = parsers(dialect, upstream, capture_content)
    cap = MAX_BODY_COPY if upstream.status < 400 else MAX_ERROR_COPY
    return Relay(transport, chunked, clock, phase, decoder, reader, copy, cap, upstream.tcp_info)
