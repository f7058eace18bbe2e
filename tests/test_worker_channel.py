"""The channel between a group's supervisor and its workers (proxy/workers/channel.py, messages.py).

Real processes where it matters, the other end faked at the channel: a real worker with this test
as a supervisor that stops reading; a real supervisor with scripted workers (a Hello of another
version, a worker that reports drops and in-flight requests, then dies).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pickle
import signal
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.listen import bind
from proxy.settings import Settings
from proxy.workers.channel import ChannelError, decode, encode, mismatch, receive, receive_hello
from proxy.workers.messages import SCHEMA, VERSION, Hello, Ready, Records, Start, schema
from proxy.workers.supervisor import Group, supervising
from tests.fakes import FakeUpstream, chat_stream, json_handler, stream_handler

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="--workers needs SO_REUSEPORT (Linux)")

UP = "127.0.0.1"  # the route's name: the upstream's host


async def scrape(group: Group) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as s, s.get(group.metrics_url + "/metrics") as r:
        text = await r.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def test_the_schema_digest_changes_with_any_field_of_a_class_that_crosses() -> None:
    inner = dataclasses.make_dataclass("Inner", [("a", int), ("b", str)])
    inner_reordered = dataclasses.make_dataclass("Inner", [("b", str), ("a", int)])
    inner_grown = dataclasses.make_dataclass("Inner", [("a", int), ("b", str), ("c", float)])

    def outer(held: type) -> type:
        return dataclasses.make_dataclass("Outer", [("items", list[held]), ("one", held | None)])  # type: ignore[valid-type]

    digests = {schema(outer(held)) for held in (inner, inner_reordered, inner_grown)}
    assert len(digests) == 3  # a field moved or added two classes deep is a new schema
    assert schema(outer(inner)) == schema(outer(dataclasses.make_dataclass("Inner", [("a", int), ("b", str)])))
    ours = Hello(VERSION, SCHEMA, os.getpid())
    assert mismatch(ours) is None
    assert mismatch(dataclasses.replace(ours, schema=schema(outer(inner)))) is not None
    assert mismatch(dataclasses.replace(ours, version="0.0.1")) is not None


async def test_frames_that_are_not_our_messages_are_refused() -> None:
    def reader_of(*frames: bytes) -> asyncio.StreamReader:
        reader = asyncio.StreamReader()
        for body in frames:
            reader.feed_data(struct.pack("!I", len(body)) + body)
        reader.feed_eof()
        return reader

    with pytest.raises(ChannelError):
        await receive(reader_of(b"abc"))  # not a pickle
    with pytest.raises(ChannelError):
        await receive(reader_of(pickle.dumps(("records", [], {}))))  # the old untyped tuples
    with pytest.raises(ChannelError):
        await receive_hello(reader_of(b'{"taotrace": "0.1.0"}'))  # a hello without its schema
    reader = asyncio.StreamReader()
    reader.feed_data(struct.pack("!I", 1 << 30))  # a length no message has: refused before it is read
    with pytest.raises(ChannelError):
        await receive(reader)
    assert await receive(reader_of()) is None  # the other end closed
    assert isinstance(await receive(reader_of(encode(Ready())[4:])), Ready)


# A worker command: the first process started is an older build (its Hello says so and it waits
# for a Start that must never come); every later one is the real worker.
OLDER_FIRST = r"""
import json, os, socket, struct, sys, time
fd = int(sys.argv[-1])
try:
    os.close(os.open(sys.argv[1], os.O_CREAT | os.O_EXCL))
except FileExistsError:
    os.execv(sys.executable, [sys.executable, "-m", "proxy.workers.worker", str(fd)])
sock = socket.socket(fileno=fd)
body = json.dumps({"taotrace": "0.0.1", "schema": "0123456789abcdef", "pid": os.getpid()}).encode()
sock.sendall(struct.pack("!I", len(body)) + body)
sock.settimeout(30)
got = sock.recv(1)
open(sys.argv[1], "w").write("told to start" if got else "closed")
"""


async def test_a_worker_of_another_version_is_refused_and_the_group_serves_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    upstream = await FakeUpstream(stream_handler(chat_stream(3))).start()
    marker = tmp_path / "older-build-started"
    settings = Settings(upstream=upstream.url, port=0, metrics_port=0, drain_seconds=2.0, workers=2)
    try:
        async with supervising(settings, worker_command=(sys.executable, "-c", OLDER_FIRST, str(marker))) as group:
            assert group.readiness() == "ready"  # the refused slot was filled by a worker of this version
            async with aiohttp.ClientSession() as s:
                for _ in range(4):
                    async with s.post(
                        group.proxy_url + "/v1/chat/completions", json={"model": "m", "stream": True}
                    ) as r:
                        assert await r.read() == b"".join(chat_stream(3))
            assert (await scrape(group))[("taotrace_worker_restarts_total", ())] == 1
    finally:
        await upstream.close()
    assert marker.read_text() == ""  # killed while it waited: never told to start, never sent a pickle
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].startswith("worker ")
    assert refusals[0].endswith(
        f"refused: it runs taotrace 0.0.1 (records 0123456789abcdef), this supervisor {VERSION} (records {SCHEMA}); "
        "restart the whole group after an upgrade"
    )


# A worker command: the first process says it dropped records, that its sinks failed on some, and
# that it has 3 requests in flight, then dies; later ones serve nothing, quietly.
REPORTS_THEN_DIES = r"""
import asyncio, os, socket, sys
from proxy.workers.channel import encode, encode_hello, receive
from proxy.workers.messages import SCHEMA, VERSION, Hello, Ready, Records, Start

async def main():
    first = True
    try:
        os.close(os.open(sys.argv[1], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        first = False
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=int(sys.argv[-1])))
    writer.write(encode_hello(Hello(VERSION, SCHEMA, os.getpid())))
    assert isinstance(await receive(reader), Start)
    writer.write(encode(Ready()))
    if first:
        busy = {("127.0.0.1", "chat_completions"): 2.0, ("127.0.0.1", "messages"): 1.0}
        writer.write(encode(Records([], busy, 5, {"spans": 1.0})))
        # Counts since it started: 7 drops in all, not 12; 3 span and 2 shipping failures.
        writer.write(encode(Records([], busy, 7, {"spans": 3.0, "workers_ship": 2.0})))
        await writer.drain()
        await asyncio.sleep(0.3)
        os._exit(1)
    await receive(reader)

asyncio.run(main())
"""


async def test_the_supervisor_counts_drops_sink_errors_and_a_dead_workers_requests_in_flight(tmp_path: Path) -> None:
    settings = Settings(
        upstream="http://127.0.0.1:9", port=0, metrics_port=0, drain_seconds=1.0, workers=1, access_log=True
    )
    command = (sys.executable, "-c", REPORTS_THEN_DIES, str(tmp_path / "first"))
    async with supervising(settings, worker_command=command) as group:

        async def restarted() -> bool:
            return group.metrics.worker_restarts.labels().get() == 1 and group.readiness() == "ready"

        await eventually(restarted)
        samples = await scrape(group)
    assert samples[("taotrace_records_dropped_total", ())] == 7
    assert samples[("taotrace_sink_errors_total", (("sink", "spans"),))] == 3
    assert samples[("taotrace_sink_errors_total", (("sink", "workers_ship"),))] == 2
    assert samples[("taotrace_sink_errors_total", (("sink", "live_view"),))] == 0  # the supervisor's own, from 0
    for in_workers in ("record", "access_log"):  # the workers' own, from 0 too (as in one process)
        assert samples[("taotrace_sink_errors_total", (("sink", in_workers),))] == 0, in_workers
    lost = {
        dict(labels)["api"]: (dict(labels)["model"], dict(labels)["status_code"], n)
        for (name, labels), n in samples.items()
        if name == "taotrace_requests_total" and dict(labels)["error_type"] == "worker_lost"
    }
    assert lost == {"chat_completions": ("unknown", "0", 2.0), "messages": ("unknown", "0", 1.0)}


async def _frames(reader: asyncio.StreamReader, quiet: float) -> list[bytes]:
    """Every frame that arrives until none has for `quiet` seconds."""
    out: list[bytes] = []
    while True:
        try:
            head = await asyncio.wait_for(reader.readexactly(4), quiet)
        except asyncio.TimeoutError:
            return out
        out.append(await reader.readexactly(struct.unpack("!I", head)[0]))


async def test_a_worker_whose_supervisor_stops_reading_holds_at_most_its_bound_and_counts_the_drops() -> None:
    """The real worker, with this test as its supervisor: it reads the Hello, sends a Start with a
    32 KiB bound, then reads nothing while 1,000 requests pass through the worker."""
    upstream = await FakeUpstream(json_handler({"ok": True})).start()
    bound, requests = 32 * 1024, 1000
    parent, child = socket.socketpair()
    child.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # little room in the kernel: the worker's bound holds
    reserved = bind("127.0.0.1", 0, port_flag="--port", host_flag="--host", backlog=None, reuse_port=True)
    port = reserved[0].getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy.workers.worker", str(child.fileno()), pass_fds=(child.fileno(),),
        stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    child.close()
    try:
        reader, writer = await asyncio.open_connection(sock=parent)
        hello = await asyncio.wait_for(receive_hello(reader), 30)
        assert hello is not None and mismatch(hello) is None and hello.pid == proc.pid
        settings = Settings(upstream=upstream.url, port=port, metrics_port=0, drain_seconds=1.0, log_level="warning")
        writer.write(encode(Start(settings.model_dump(), 0, False, bound)))
        assert isinstance(await asyncio.wait_for(receive(reader), 30), Ready)

        transport = writer.transport
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # from here on the supervisor reads nothing

        async def one(session: aiohttp.ClientSession) -> bytes:
            async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m"}) as r:
                assert r.status == 200
                return await r.read()

        async with aiohttp.ClientSession() as session:
            for _ in range(requests // 20):
                bodies = await asyncio.gather(*(one(session) for _ in range(20)))
                assert all(b == b'{"ok": true}' for b in bodies)  # requests are unaffected
        await asyncio.sleep(0.5)  # the last batches and gauge reports are written (or dropped)

        transport.resume_reading()
        frames = await _frames(reader, quiet=1.0)  # what the worker held for us, and no more
        messages = [decode(f) for f in frames]
        records = [rec for m in messages if isinstance(m, Records) for rec in m.records]
        dropped = max(m.dropped for m in messages if isinstance(m, Records))
        assert dropped > 0 and len(records) + dropped == requests  # each record arrived or was counted
        held = sum(len(f) + 4 for f in frames)
        unbounded = held / len(records) * requests
        assert held <= bound + max(len(f) for f in frames) + 64 * 1024, (held, bound)  # + one message, + the kernel's
        assert unbounded > 3 * held  # what it would have held without the bound
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        for sock in reserved:
            sock.close()
        parent.close()
        await upstream.close()
