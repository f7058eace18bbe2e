"""`proxy/upstream/tcpinfo.py`: the `struct tcp_info` parser against bytes this kernel returned, older
(shorter) layouts, real sockets, and the per-request combination of readings.

`data/tcp_info_linux-6.18_loopback.bin` is `getsockopt(IPPROTO_TCP, TCP_INFO, 512)` of a
loopback connection on Linux 6.18 (280 bytes); `ss -tin` read the same connection at the same
moment (`...loopback.ss.txt`): `rtt:0.02/0.012` ms, `minrtt:0.005` ms,
`delivery_rate 80281600000bps`, no retransmits.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
from pathlib import Path

import pytest

from proxy.dialects import Usage
from proxy.exchange.record import RequestRecord
from proxy.exchange.timing import PhaseClock
from proxy.upstream import tcpinfo
from proxy.upstream.tcpinfo import NEW_CONNECTION, TcpInfo, TcpStats, parse, request_stats

CAPTURED = (Path(__file__).parent / "data" / "tcp_info_linux-6.18_loopback.bin").read_bytes()
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO is read on Linux only")


def test_captured_bytes_parse_to_what_ss_reported() -> None:
    assert len(CAPTURED) == 280
    info = parse(CAPTURED)
    assert info == TcpInfo(
        rtt=20e-6, rtt_var=12e-6, min_rtt=5e-6, total_retrans=0, delivery_rate=80281600000 // 8, rcv_ooopack=0
    )


@pytest.mark.parametrize(
    "length,has",
    [
        (104, {"rtt", "rtt_var", "total_retrans"}),  # Linux 2.6 … 3.x: the struct ends at tcpi_total_retrans
        (152, {"rtt", "rtt_var", "total_retrans", "min_rtt"}),  # 4.6: min_rtt
        (168, {"rtt", "rtt_var", "total_retrans", "min_rtt", "delivery_rate"}),  # 4.9: delivery_rate
        (232, {"rtt", "rtt_var", "total_retrans", "min_rtt", "delivery_rate", "rcv_ooopack"}),  # 5.4+
        (76, {"rtt", "rtt_var"}),
        (60, set()),
        (0, set()),
    ],
)
def test_a_shorter_struct_gives_the_fields_it_covers(length: int, has: set[str]) -> None:
    full = parse(CAPTURED)
    short = parse(CAPTURED[:length])
    for name in ("rtt", "rtt_var", "min_rtt", "total_retrans", "delivery_rate", "rcv_ooopack"):
        assert getattr(short, name) == (getattr(full, name) if name in has else None), name


def test_counters_and_no_min_rtt_sample() -> None:
    buf = bytearray(CAPTURED)
    struct.pack_into("=I", buf, 100, 7)  # tcpi_total_retrans
    struct.pack_into("=I", buf, 148, 0xFFFFFFFF)  # tcpi_min_rtt before any sample
    struct.pack_into("=I", buf, 224, 3)  # tcpi_rcv_ooopack
    info = parse(bytes(buf))
    assert (info.total_retrans, info.min_rtt, info.rcv_ooopack) == (7, None, 3)


@linux_only
def test_read_a_real_loopback_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        client = socket.create_connection(srv.getsockname())
        peer, _ = srv.accept()
        with client, peer:
            client.sendall(b"ping")
            assert peer.recv(4) == b"ping"
            info = tcpinfo.read(client)
            assert info is not None and info.rtt is not None and 0 < info.rtt < 0.5
            assert info.total_retrans == 0 and info.min_rtt is not None and info.min_rtt > 0
        assert tcpinfo.read(client) is None  # closed


@linux_only
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_read_through_a_transports_socket_leaves_the_connection_working(loop: str) -> None:
    # What proxy/upstream/ reads: the transport's stand-in for its socket (uvloop's PseudoSocket,
    # asyncio's TransportSocket). Read many times, the descriptor stays open and usable.
    async def main() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readexactly(4))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        async with server:
            reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            sock = writer.transport.get_extra_info("socket")
            assert not isinstance(sock, socket.socket)
            for _ in range(1000):
                info = tcpinfo.read(sock)
                assert info is not None and info.total_retrans == 0
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            after = tcpinfo.read(sock)
            assert after is not None and after.rtt is not None and after.rtt > 0
            writer.close()
            await writer.wait_closed()

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(main())
    else:
        asyncio.run(main())


def test_read_gives_nothing_for_what_is_not_a_tcp_socket() -> None:
    assert tcpinfo.read(None) is None
    a, b = socket.socketpair()  # AF_UNIX: no TCP_INFO
    with a, b:
        assert tcpinfo.read(a) is None


def test_request_stats_rtt_at_first_token_counters_since_acquisition() -> None:
    start = TcpInfo(rtt=0.01, total_retrans=5, rcv_ooopack=2)
    first = TcpInfo(rtt=0.02, rtt_var=0.001, min_rtt=0.015, total_retrans=6, rcv_ooopack=2, delivery_rate=10)
    end = TcpInfo(rtt=0.09, rtt_var=0.004, min_rtt=0.015, total_retrans=9, rcv_ooopack=4, delivery_rate=99)
    stats = request_stats(start, first, end)
    assert stats == TcpStats(rtt=0.02, rtt_var=0.001, min_rtt=0.015, retransmits=4, out_of_order=2, delivery_rate=99)
    assert stats.round_trip == 0.015
    # No first token (not a stream): the end reading; a new connection counts from zero.
    assert request_stats(NEW_CONNECTION, None, end) == TcpStats(
        rtt=0.09, rtt_var=0.004, min_rtt=0.015, retransmits=9, out_of_order=4, delivery_rate=99
    )
    # No end reading (the socket was gone): counters up to the first token.
    got = request_stats(start, first, None)
    assert got is not None and (got.retransmits, got.out_of_order) == (1, 0)
    # An unknown baseline leaves the counters unknown rather than counting the connection's life.
    got = request_stats(None, first, end)
    assert got is not None and got.rtt == 0.02 and got.retransmits is None and got.out_of_order is None
    assert request_stats(start, None, None) is None
    # u32 counters wrap.
    wrapped = request_stats(TcpInfo(total_retrans=0xFFFFFFFE), None, TcpInfo(rtt=0.01, total_retrans=1))
    assert wrapped is not None and wrapped.retransmits == 3
    # A kernel without min_rtt: the smoothed RTT is the round trip.
    no_min = request_stats(None, None, TcpInfo(rtt=0.03))
    assert no_min is not None and no_min.round_trip == 0.03


def _record(prefill_wait: float | None, tcp: TcpStats | None) -> RequestRecord:
    phase = PhaseClock(0.0)
    phase.sent(0.01)
    if prefill_wait is not None:
        phase.token(0.01 + prefill_wait)
    return RequestRecord(
        trace_id=None, api="chat_completions", operation="chat", model="m", response_model=None, stream=True,
        method="POST", path="/v1/chat/completions", status_code=200, error_type="", timing=phase.finish(1.0),
        usage=Usage(), usage_source="none", finish_reasons=(), response_id=None, tcp=tcp,
    )  # fmt: skip


def test_server_wait_is_prefill_wait_minus_one_round_trip_floored_at_zero() -> None:
    tcp = TcpStats(rtt=0.03, rtt_var=0.01, min_rtt=0.02, retransmits=0, out_of_order=0, delivery_rate=None)
    assert _record(0.5, tcp).server_wait == pytest.approx(0.48)  # min_rtt, not the smoothed rtt
    assert _record(0.01, tcp).server_wait == 0.0
    assert _record(None, tcp).server_wait is None  # no first token
    assert _record(0.5, None).server_wait is None  # no TCP_INFO (not Linux)
