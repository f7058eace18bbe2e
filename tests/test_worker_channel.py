"""The channel between a group's supervisor and its workers (proxy/workers/channel.py, messages.py).

Real processes where it matters, the other end faked at the channel: a real worker with this test
as a supervisor that stops reading; a real supervisor with scripted workers (a Hello of another
version, a worker that reports its sinks' failures and requests in flight, then dies).
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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.config.settings import Settings
from proxy.server.listen import bind
from proxy.ui.ring import Query
from proxy.workers.channel import ChannelError, decode, decode_frame, encode, mismatch, receive, receive_hello
from proxy.workers.messages import SCHEMA, VERSION, WIRE, Answer, Ask, Hello, Ready, Report, Start, schema
from proxy.workers.supervisor import ASK_TIMEOUT, Group, supervising
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
    # The way messages are written is part of the digest: same classes, another wire, refused.
    roots = (Hello, Start, Ready, Report, Ask, Answer)
    assert schema(*roots) == SCHEMA and schema(*roots, wire=WIRE - 1) != SCHEMA
    assert mismatch(dataclasses.replace(ours, schema=schema(*roots, wire=WIRE - 1))) is not None


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
    with pytest.raises(ChannelError):  # a pickle of a class that is not a message
        await receive(reader_of(pickle.dumps(Query(), protocol=pickle.HIGHEST_PROTOCOL)))
    with pytest.raises(ChannelError):  # what the builds that shipped records wrote: a kind byte first
        await receive(reader_of(b"P" + pickle.dumps(Ready())))
    report = Report([("taotrace_requests", [(("up", "chat", "m", "200", ""), 3.0)])], ask=7)
    assert decode_frame(encode(report)) == report
    with pytest.raises(ChannelError):
        await receive_hello(reader_of(b'{"taotrace": "0.1.0"}'))  # a hello without its schema
    reader = asyncio.StreamReader()
    reader.feed_data(struct.pack("!I", 1 << 30))  # a length no message has: refused before it is read
    with pytest.raises(ChannelError):
        await receive(reader)
    assert await receive(reader_of()) is None  # the other end closed
    assert isinstance(await receive(reader_of(encode(Ready())[4:])), Ready)
    assert isinstance(decode_frame(encode(Ready())), Ready)
    for cut in (encode(Ready())[:-1], encode(Ready()) + b"x", b"\0\0"):  # a frame is whole or refused
        with pytest.raises(ChannelError):
            decode_frame(cut)


# A worker command: the first process started is another build (its Hello says which, argv[2] and
# argv[3], and it waits for a Start that must never come); every later one is the real worker.
OLDER_FIRST = r"""
import json, os, socket, struct, sys, time
fd = int(sys.argv[-1])
try:
    os.close(os.open(sys.argv[1], os.O_CREAT | os.O_EXCL))
except FileExistsError:
    os.execv(sys.executable, [sys.executable, "-m", "proxy.workers.worker", str(fd)])
sock = socket.socket(fileno=fd)
body = json.dumps({"taotrace": sys.argv[2], "schema": sys.argv[3], "pid": os.getpid()}).encode()
sock.sendall(struct.pack("!I", len(body)) + body)
sock.settimeout(30)
got = sock.recv(1)
open(sys.argv[1], "w").write("told to start" if got else "closed")
"""


# The digest the last build that shipped records said in its Hello (same version).
RECORDS_SCHEMA = "1ace7c1c291c951c"


@pytest.mark.parametrize(
    "version,digest", [("0.0.1", "0123456789abcdef"), (VERSION, RECORDS_SCHEMA)], ids=["older", "records"]
)
async def test_a_worker_of_another_version_is_refused_and_the_group_serves_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, version: str, digest: str
) -> None:
    upstream = await FakeUpstream(stream_handler(chat_stream(3))).start()
    marker = tmp_path / "older-build-started"
    settings = Settings(upstream=upstream.url, port=0, metrics_port=0, drain_seconds=2.0, workers=2)
    try:
        command = (sys.executable, "-c", OLDER_FIRST, str(marker), version, digest)
        async with supervising(settings, worker_command=command) as group:
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
        f"refused: it runs taotrace {version} (messages {digest}), this supervisor {VERSION} (messages {SCHEMA}); "
        "restart the whole group after an upgrade"
    )


# A worker command: the first process reports that its sinks failed on some records and that it
# has 3 requests in flight, then dies; later ones serve nothing, quietly.
REPORTS_THEN_DIES = r"""
import asyncio, os, socket, sys
from proxy.workers.channel import encode, encode_hello, receive
from proxy.workers.messages import SCHEMA, VERSION, Hello, Ready, Report, Start

async def heartbeat(writer):  # an empty report a second, as a real worker's running loop sends
    while True:
        writer.write(encode(Report([])))
        await asyncio.sleep(1.0)

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
        busy = [(("127.0.0.1", "chat_completions"), 2.0), (("127.0.0.1", "messages"), 1.0)]
        done = [(("127.0.0.1", "chat_completions", "m", "200", ""), 4.0)]
        writer.write(encode(Report([("taotrace_requests", done), ("taotrace_in_flight_requests", busy),
                                    ("taotrace_sink_errors", [(("spans",), 1.0), (("access_log",), 0.0)])])))
        # Changes: 2 more span failures, one of the chat requests finished.
        writer.write(encode(Report([("taotrace_requests", [(done[0][0], 1.0)]),
                                    ("taotrace_in_flight_requests", [(busy[0][0], 1.0)]),
                                    ("taotrace_sink_errors", [(("spans",), 2.0)])])))
        await writer.drain()
        await asyncio.sleep(0.3)
        os._exit(1)
    beat = asyncio.ensure_future(heartbeat(writer))  # it runs, as a serving worker's loop does
    while await receive(reader) is not None:  # a scrape's question goes unanswered
        pass

asyncio.run(main())
"""


async def test_the_supervisor_adds_reports_and_counts_a_dead_workers_requests_in_flight_once(tmp_path: Path) -> None:
    settings = Settings(upstream="http://127.0.0.1:9", port=0, metrics_port=0, drain_seconds=1.0, workers=2)
    command = (sys.executable, "-c", REPORTS_THEN_DIES, str(tmp_path / "first"))
    async with supervising(settings, worker_command=command) as group:

        async def restarted() -> bool:
            return group.metrics.worker_restarts.labels().get() == 1 and group.readiness() == "ready"

        await eventually(restarted)
        began = time.monotonic()
        samples = await scrape(group)  # neither worker answers its question: the scrape waits ASK_TIMEOUT
        assert time.monotonic() - began < ASK_TIMEOUT + 2.0
        await asyncio.sleep(1.2)  # a report period of the successor, and a second scrape: nothing counted twice
        again = await scrape(group)
    assert samples == again
    assert samples[("taotrace_sink_errors_total", (("sink", "spans"),))] == 3
    assert samples[("taotrace_sink_errors_total", (("sink", "access_log"),))] == 0  # made at 0 in the worker
    requests = {
        (dict(labels)["api"], dict(labels)["error_type"], dict(labels)["model"], dict(labels)["status_code"]): n
        for (name, labels), n in samples.items()
        if name == "taotrace_requests_total"
    }
    assert requests == {
        ("chat_completions", "", "m", "200"): 5,
        ("chat_completions", "worker_lost", "unknown", "0"): 1,  # as its last report had them in flight
        ("messages", "worker_lost", "unknown", "0"): 1,
    }
    in_flight = {k: v for k, v in samples.items() if k[0] == "taotrace_in_flight_requests"}
    assert set(in_flight.values()) == {0.0}  # what the dead worker had in flight is taken back


async def _frames(reader: asyncio.StreamReader, quiet: float) -> list[bytes]:
    """Every frame that arrives until none has for `quiet` seconds."""
    out: list[bytes] = []
    while True:
        try:
            head = await asyncio.wait_for(reader.readexactly(4), quiet)
        except asyncio.TimeoutError:
            return out
        out.append(await reader.readexactly(struct.unpack("!I", head)[0]))


async def _real_worker(
    upstream: FakeUpstream, bound: int, sndbuf: int | None = None
) -> tuple[asyncio.subprocess.Process, asyncio.StreamReader, asyncio.StreamWriter, int, list[socket.socket]]:
    """The real worker with this test as its supervisor, told to serve `upstream` (its Ready read)."""
    parent, child = socket.socketpair()
    if sndbuf is not None:
        child.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    reserved = bind("127.0.0.1", 0, port_flag="--port", host_flag="--host", backlog=None, reuse_port=True)
    port = reserved[0].getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy.workers.worker", str(child.fileno()), pass_fds=(child.fileno(),),
        stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    child.close()
    reader, writer = await asyncio.open_connection(sock=parent)
    hello = await asyncio.wait_for(receive_hello(reader), 30)
    assert hello is not None and mismatch(hello) is None and hello.pid == proc.pid
    settings = Settings(upstream=upstream.url, port=port, metrics_port=0, drain_seconds=1.0, log_level="warning")
    writer.write(encode(Start(settings.model_dump(), 0, "pod-0", bound)))
    while not isinstance(await asyncio.wait_for(receive(reader), 30), Ready):
        pass  # a first report may come before
    return proc, reader, writer, port, reserved


def _requests(messages: Sequence[object]) -> float:
    """The requests the reports among `messages` added up to."""
    return sum(  # type: ignore[no-any-return]
        n
        for m in messages
        if isinstance(m, Report)
        for name, changed in m.changes
        if name == "taotrace_requests"
        for _labels, n in changed
    )


async def test_a_worker_whose_supervisor_stops_reading_holds_its_reports_back_and_loses_nothing() -> None:
    """The real worker, with this test as its supervisor: reads nothing while 1,000 requests pass
    through the worker, asks for its metrics (no answer while it holds back), then reads again:
    one report carries what the held ones would have, and the count is every request."""
    upstream = await FakeUpstream(json_handler({"ok": True})).start()
    requests = 1000
    proc, reader, writer, port, reserved = await _real_worker(upstream, bound=4096, sndbuf=4096)
    try:
        transport = writer.transport
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # from here on the supervisor reads nothing
        # Fill the socket and the worker's bound: questions it must not answer past its bound.
        for n in range(1, 200):
            writer.write(encode(Ask(n, "requests", Query(limit=1000))))
        await writer.drain()

        async def one(session: aiohttp.ClientSession) -> bytes:
            async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m"}) as r:
                assert r.status == 200
                return await r.read()

        async with aiohttp.ClientSession() as session:
            for _ in range(requests // 20):
                bodies = await asyncio.gather(*(one(session) for _ in range(20)))
                assert all(b == b'{"ok": true}' for b in bodies)  # requests are unaffected
        await asyncio.sleep(2.5)  # report periods pass: each held back
        transport.resume_reading()
        held = [decode(f) for f in await _frames(reader, quiet=1.0)]
        assert sum(len(pickle.dumps(m)) for m in held) < 256 * 1024  # bounded: not 200 answers of 1,000 rows
        writer.write(encode(Ask(1000, "metrics")))  # a scrape: what is left, at once
        after = [decode(f) for f in await _frames(reader, quiet=1.0)]
        assert any(isinstance(m, Report) and m.ask == 1000 for m in after)
        assert _requests(held) + _requests(after) == requests  # every request counted, once
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        for sock in reserved:
            sock.close()
        writer.close()
        await upstream.close()


async def test_a_worker_reports_every_request_before_it_exits() -> None:
    """The real worker: bursts of requests, then SIGTERM right after the last answer: its last
    report is written before it exits, and the reports add up to every request."""
    upstream = await FakeUpstream(json_handler({"ok": True})).start()
    proc, reader, writer, port, reserved = await _real_worker(upstream, 16 * 1024 * 1024)
    try:

        async def one(session: aiohttp.ClientSession, n: int) -> None:
            async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": f"m{n % 3}"}) as r:
                assert r.status == 200 and await r.read() == b'{"ok": true}'

        async with aiohttp.ClientSession() as session:
            for burst in range(4):
                await asyncio.gather(*(one(session, 50 * burst + k) for k in range(50)))
        proc.send_signal(signal.SIGTERM)  # the last burst's counts are not reported yet
        messages = []
        while (message := await asyncio.wait_for(receive(reader), 30)) is not None:
            messages.append(message)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
        for sock in reserved:
            sock.close()
        writer.close()
        await upstream.close()
    assert _requests(messages) == 200


# A worker command: it sends one report (3 finished requests, 2 in flight) and is killed while it
# writes the next one: half a frame reaches the supervisor.
KILLED_MID_REPORT = r"""
import asyncio, os, socket, sys
from proxy.workers.channel import encode, encode_hello, receive
from proxy.workers.messages import SCHEMA, VERSION, Hello, Ready, Report, Start

async def heartbeat(writer):  # an empty report a second, as a real worker's running loop sends
    while True:
        writer.write(encode(Report([])))
        await asyncio.sleep(1.0)

async def main():
    first = True  # only one of the two workers (both start at once: the file is made atomically)
    try:
        os.close(os.open(sys.argv[1], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        first = False
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=int(sys.argv[-1])))
    writer.write(encode_hello(Hello(VERSION, SCHEMA, os.getpid())))
    assert isinstance(await receive(reader), Start)
    writer.write(encode(Ready()))
    if first:
        done = ("127.0.0.1", "chat_completions", "m", "200", "")
        busy = ("taotrace_in_flight_requests", [(("127.0.0.1", "chat_completions"), 2.0)])
        writer.write(encode(Report([("taotrace_requests", [(done, 3.0)]), busy])))
        cut = encode(Report([("taotrace_requests", [(done, 5.0)]), busy]))
        writer.write(cut[: len(cut) // 2])
        await writer.drain()
        await asyncio.sleep(0.3)
        os._exit(1)
    beat = asyncio.ensure_future(heartbeat(writer))  # it runs, as a serving worker's loop does
    while await receive(reader) is not None:  # a scrape's question goes unanswered
        pass

asyncio.run(main())
"""


@pytest.mark.e2e
async def test_a_worker_killed_mid_report_counts_its_requests_in_flight_as_lost(tmp_path: Path) -> None:
    settings = Settings(upstream="http://127.0.0.1:9", port=0, metrics_port=0, drain_seconds=1.0, workers=2)
    command = (sys.executable, "-c", KILLED_MID_REPORT, str(tmp_path / "first"))
    async with supervising(settings, worker_command=command) as group:

        async def restarted() -> bool:
            return group.metrics.worker_restarts.labels().get() == 1 and group.readiness() == "ready"

        await eventually(restarted)
        samples = await scrape(group)
    requests = {
        (dict(labels)["error_type"], dict(labels)["status_code"]): n
        for (name, labels), n in samples.items()
        if name == "taotrace_requests_total"
    }
    # the whole report counted, the half one never applied, the two in flight lost
    assert requests == {("", "200"): 3, ("worker_lost", "0"): 2}
