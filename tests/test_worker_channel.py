"""The channel between a group's supervisor and its workers (proxy/workers/channel.py, messages.py).

Real processes where it matters, the other end faked at the channel: a real worker with this test
as a supervisor that stops reading; a real supervisor with scripted workers (a Hello of another
version, a worker that reports drops and in-flight requests, then dies).
"""

from __future__ import annotations

import asyncio
import dataclasses
import marshal
import os
import pickle
import random
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

from proxy.accounting.prices import Cost
from proxy.accounting.ratelimits import RateLimit, RateLimits
from proxy.config.settings import Settings
from proxy.exchange.record import SpanStart
from proxy.server.listen import bind
from proxy.upstream.tcpinfo import TcpStats
from proxy.workers.channel import ChannelError, decode, decode_frame, encode, mismatch, receive, receive_hello
from proxy.workers.messages import (
    SCHEMA,
    VERSION,
    WIRE,
    AskInFlight,
    Hello,
    InFlightAnswer,
    Ready,
    Records,
    Start,
    schema,
)
from proxy.workers.plain import Plain
from proxy.workers.supervisor import Group, supervising
from proxy.workers.worker import BATCH_DELAY, BATCH_RECORDS, Shipper
from tests.fakes import FakeUpstream, chat_stream, json_handler, record_for, stream_handler

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
    roots = (Hello, Start, Ready, Records, AskInFlight, InFlightAnswer)
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
    with pytest.raises(ChannelError):  # records as the pickle-only build wrote them
        await receive(reader_of(pickle.dumps(Records([], {}, 0, {}), protocol=pickle.HIGHEST_PROTOCOL)))
    with pytest.raises(ChannelError):  # records arrive in their own form, never as a pickle frame
        await receive(reader_of(b"P" + pickle.dumps(Records([], {}, 0, {}))))
    with pytest.raises(ChannelError):  # a record of another shape (fields added or taken away)
        await receive(reader_of(b"R" + marshal.dumps(([("a", "b")], {}, 0, {}, {}))))
    with pytest.raises(ChannelError):
        await receive(reader_of(b"R" + b"not marshal"))
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


# The digest the last build that wrote every message as a pickle said in its Hello (same version).
PICKLE_ONLY_SCHEMA = "e3dc5af759871c4d"


@pytest.mark.parametrize(
    "version,digest", [("0.0.1", "0123456789abcdef"), (VERSION, PICKLE_ONLY_SCHEMA)], ids=["older", "pickle-only"]
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
        f"refused: it runs taotrace {version} (records {digest}), this supervisor {VERSION} (records {SCHEMA}); "
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


def test_a_record_crosses_the_channel_whole() -> None:
    """Every field, the nested classes and the optional ones set, arrives as the worker built it."""
    rnd = random.Random(5)
    base = record_for("chat_completions", "gpt-4o", 200, rnd, tokens=30)
    span = SpanStart(
        name="chat gpt-4o", trace_id=rnd.getrandbits(128), span_id=rnd.getrandbits(64), trace_flags=1,
        trace_state=(("vendor", "x"),), parent=(rnd.getrandbits(128), rnd.getrandbits(64), 1, True, ()),
        start=1_700_000_000_000_000_000,
        attributes={"url.path": "/v1/chat/completions", "server.port": 443, "gen_ai.request.temperature": 0.2,
                    "gen_ai.request.stream": True, "gen_ai.request.stop_sequences": ("\n", "END")},
        output='[{"role": "assistant"}]', output_value="the answer", offset=-12345, links=((1, 2, 1, False, (("k", "v"),)),),
    )  # fmt: skip
    full = dataclasses.replace(
        base,
        timing=dataclasses.replace(base.timing, chunk_gaps=(0.001, 0.002), relay=(4e-6,), ttfc=0.01),
        attributes=(("taotrace.key.id", "k-1234"), ("app.team", "search")),
        rate_limits=RateLimits(
            limits=(RateLimit(kind="requests", limit=500, remaining=499, reset=0.12), RateLimit(kind="tokens")),
            retry_after=1.5, observed_at=1.7e9,
        ),  # fmt: skip
        cost=Cost(amount=0.0123, cache_savings=None, currency="USD"),
        tcp=TcpStats(rtt=4e-5, rtt_var=1e-5, min_rtt=2e-5, retransmits=0, out_of_order=None, delivery_rate=10**9),
        span=span, upstream="openai", pair_id="p-1", mirror=True, input_content='[{"role": "user"}]',
    )  # fmt: skip
    message = Records([full, base], {("openai", "chat_completions"): 2.0}, 3, {"spans": 1.0}, {"per_minute": 4})
    frame = encode(message)
    assert frame[4:5] == b"R"
    back = decode_frame(frame)
    assert back == message
    assert isinstance(back, Records) and type(back.records[0].span) is SpanStart
    assert back.records[0].rate_limits is not None and back.records[0].rate_limits.limits[1] == RateLimit(kind="tokens")


def test_the_tuple_form_refuses_a_class_whose_fields_it_cannot_set() -> None:
    """Records are rebuilt by setting slots directly: a dataclass without slots is refused when
    its form is made (at import), not when a record crosses."""

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    with pytest.raises(TypeError, match="NoSlots is not a slots dataclass"):
        Plain(NoSlots)


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
    writer.write(encode(Start(settings.model_dump(), 0, False, bound)))
    assert isinstance(await asyncio.wait_for(receive(reader), 30), Ready)
    return proc, reader, writer, port, reserved


async def test_records_arrive_in_order_in_batches_and_none_is_lost_when_a_worker_drains() -> None:
    """The real worker: requests one after another (each its own model name, so the order shows),
    then bursts (batched), then SIGTERM right after the last answer: what is still waiting for its
    batch is sent before the worker exits."""
    upstream = await FakeUpstream(json_handler({"ok": True})).start()
    proc, reader, writer, port, reserved = await _real_worker(upstream, 16 * 1024 * 1024)
    try:

        async def one(session: aiohttp.ClientSession, n: int) -> None:
            async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": f"m{n}"}) as r:
                assert r.status == 200 and await r.read() == b'{"ok": true}'

        async with aiohttp.ClientSession() as session:
            for n in range(40):
                await one(session, n)
            for burst in range(4):
                await asyncio.gather(*(one(session, 1000 + 50 * burst + k) for k in range(50)))
        proc.send_signal(signal.SIGTERM)  # the last burst's records are still in their batch
        frames = []
        while (message := await asyncio.wait_for(receive(reader), 30)) is not None:
            frames.append(message)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
        for sock in reserved:
            sock.close()
        writer.close()
        await upstream.close()
    batches = [m.records for m in frames if isinstance(m, Records) and m.records]
    models = [rec.model or "" for batch in batches for rec in batch]
    assert models[:40] == [f"m{n}" for n in range(40)]  # in the order they finished
    assert sorted(models[40:]) == sorted(f"m{1000 + k}" for k in range(200))  # every one, none twice
    assert all(m.dropped == 0 for m in frames if isinstance(m, Records))
    assert len(batches) < 40 + 200  # some travelled together
    assert max(map(len, batches)) < BATCH_RECORDS + 50  # full at 128, sent on the next turn (one burst may join)


async def test_a_full_batch_leaves_at_once_and_a_lone_record_within_the_delay() -> None:
    """The real `Shipper` over a socketpair: `BATCH_RECORDS` records go on the next turn of the loop,
    without waiting for the delay; fewer go after `BATCH_DELAY`; each message says the counts."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=theirs)
    their_reader, their_writer = await asyncio.open_connection(sock=ours)
    shipper = Shipper(writer, max_buffered=16 * 1024 * 1024)
    rnd = random.Random(3)
    records = [record_for("chat_completions", f"m{i}", 200, rnd) for i in range(BATCH_RECORDS + 1)]
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        for rec in records[:BATCH_RECORDS]:
            shipper.record(rec)
        first = await asyncio.wait_for(receive(their_reader), 10)
        assert isinstance(first, Records) and [r.model for r in first.records] == [
            f"m{i}" for i in range(BATCH_RECORDS)
        ]
        assert loop.time() - began < BATCH_DELAY * 100  # a loop turn, not the delay (a loaded host: wide bar)
        shipper.record(records[-1])
        assert shipper.buffered() == 0  # held for its batch, not written at once
        second = await asyncio.wait_for(receive(their_reader), 10)
        assert isinstance(second, Records) and second.records == [records[-1]]
    finally:
        writer.close()
        their_writer.close()
        reader.feed_eof()


# A worker command: it sends one batch (3 finished requests, 2 in flight) and is killed while it
# writes the next one: half a frame reaches the supervisor.
KILLED_MID_BATCH = r"""
import asyncio, os, random, socket, sys
sys.path.insert(0, sys.argv[1])
from proxy.workers.channel import encode, encode_hello, receive
from proxy.workers.messages import SCHEMA, VERSION, Hello, Ready, Records, Start
from tests.fakes import record_for

async def main():
    first = not os.path.exists(sys.argv[2])
    open(sys.argv[2], "a").close()
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=int(sys.argv[-1])))
    writer.write(encode_hello(Hello(VERSION, SCHEMA, os.getpid())))
    assert isinstance(await receive(reader), Start)
    writer.write(encode(Ready()))
    if first:
        rnd = random.Random(1)
        done = [record_for("chat_completions", "m", 200, rnd) for _ in range(3)]
        busy = {("127.0.0.1", "chat_completions"): 2.0}
        writer.write(encode(Records(done, busy, 0, {})))
        cut = encode(Records([record_for("chat_completions", "m", 200, rnd) for _ in range(5)], busy, 0, {}))
        writer.write(cut[: len(cut) // 2])
        await writer.drain()
        await asyncio.sleep(0.3)
        os._exit(1)
    await receive(reader)

asyncio.run(main())
"""


@pytest.mark.e2e
async def test_a_worker_killed_mid_batch_counts_its_requests_in_flight_as_lost(tmp_path: Path) -> None:
    settings = Settings(upstream="http://127.0.0.1:9", port=0, metrics_port=0, drain_seconds=1.0, workers=1)
    root = str(Path(__file__).resolve().parent.parent)
    command = (sys.executable, "-c", KILLED_MID_BATCH, root, str(tmp_path / "first"))
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
    # the whole batch counted, the half one never applied, the two in flight lost
    assert requests == {("", "200"): 3, ("worker_lost", "0"): 2}
