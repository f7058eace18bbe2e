"""A small fault-injecting TCP relay for tests (toxiproxy and tc netem are not available here).

    taotrace ──► FaultProxy (127.0.0.1:0) ──► target (a FakeUpstream)

Every accepted connection is relayed byte for byte in both directions; `faults` (read when a
connection opens) adds latency, a bandwidth cap, tiny writes, or cuts the response after N
bytes with a reset (RST) or a plain close (FIN). Also here: `blackhole()`, a listening socket
whose accept queue is full, so a connect to it hangs (SYNs are dropped) instead of failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["FaultProxy", "Faults", "blackhole", "reset"]


@dataclass
class Faults:
    """What to do to each new connection. Defaults: relay untouched."""

    latency: float = 0.0  # seconds added before each relayed response chunk
    bandwidth: float | None = None  # response bytes per second
    slice: int | None = None  # write the response in pieces of this size (1: byte by byte)
    cut_after: int | None = None  # response bytes relayed before the connection is cut
    cut: str = "reset"  # "reset" (RST) or "fin" (orderly close: a truncation)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST instead of FIN (SO_LINGER 0)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass
class FaultProxy:
    """A relay on an ephemeral loopback port in front of `target_port`."""

    target_port: int
    target_host: str = "127.0.0.1"
    faults: Faults = field(default_factory=Faults)
    connections: int = 0  # accepted so far
    cuts: int = 0  # connections cut on purpose
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        faults = self.faults
        try:
            up_r, up_w = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            reset(down_w)
            return
        requests = asyncio.create_task(self._relay_requests(down_r, up_w))
        self._tasks.add(requests)
        requests.add_done_callback(self._tasks.discard)
        try:
            await self._relay_responses(up_r, down_w, faults)
        except (OSError, asyncio.IncompleteReadError):
            reset(down_w)
        finally:
            requests.cancel()
            up_w.transport.abort()
            if not down_w.transport.is_closing():
                down_w.close()

    @staticmethod
    async def _relay_requests(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        with contextlib.suppress(OSError):
            dst.write_eof()

    async def _relay_responses(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, f: Faults) -> None:
        sent = 0
        while data := await src.read(65536):
            if f.cut_after is not None and sent + len(data) >= f.cut_after:
                if f.cut_after > sent:
                    dst.write(data[: f.cut_after - sent])
                    await dst.drain()
                    await asyncio.sleep(0.05)  # let the partial bytes reach the reader before the cut
                self.cuts += 1
                if f.cut == "reset":
                    reset(dst)
                else:
                    dst.close()
                return
            if f.latency:
                await asyncio.sleep(f.latency)
            for piece in _pieces(data, f.slice):
                dst.write(piece)
                await dst.drain()
                if f.bandwidth:
                    await asyncio.sleep(len(piece) / f.bandwidth)
            sent += len(data)
        dst.close()


def _pieces(data: bytes, size: int | None) -> Iterator[bytes]:
    if not size:
        yield data
        return
    for i in range(0, len(data), size):
        yield data[i : i + size]


@contextlib.contextmanager
def blackhole() -> Iterator[str]:
    """A URL whose connects hang: a listener with backlog 0 that never accepts, queue pre-filled."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        # Linux accepts backlog+1 connections into the queue; after that, SYNs are dropped.
        for _ in range(8):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError, OSError):
                s.connect(("127.0.0.1", port))
            fillers.append(s)
        yield f"http://127.0.0.1:{port}"
    finally:
        for s in fillers:
            s.close()
        listener.close()
