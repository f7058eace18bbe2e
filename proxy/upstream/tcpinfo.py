"""The kernel's view of a TCP connection: Linux `TCP_INFO`, parsed by the layout in `linux/tcp.h`.

`parse()` is pure (bytes in, a frozen `TcpInfo` out); `read()` is the one system call. A field is
read only when the length the kernel returned covers it, so an older kernel's shorter struct
gives the fields it has and None for the rest. Anything but Linux (other systems' `TCP_INFO`
has another layout) reads nothing.

    offset  field (u32 unless noted)       kernel
        68  tcpi_rtt     smoothed RTT, µs   2.6
        72  tcpi_rttvar  µs                 2.6
       100  tcpi_total_retrans              2.6   (the 104-byte struct ends here)
       148  tcpi_min_rtt µs (~0: no sample) 4.6
       160  tcpi_delivery_rate (u64, B/s)   4.9
       224  tcpi_rcv_ooopack                5.4

`request_stats()` turns the readings of one request (when its connection was taken, at the
first token, at the end) into the `TcpStats` that spans and metrics report.
"""

from __future__ import annotations

import _socket
import socket
import struct
import sys
from dataclasses import dataclass
from typing import Protocol

__all__ = ["NEW_CONNECTION", "TcpInfo", "TcpStats", "parse", "read", "request_stats"]

_U32 = struct.Struct("=I")  # native byte order and standard sizes: the kernel's own
_U64 = struct.Struct("=Q")
_RTT, _RTTVAR, _TOTAL_RETRANS, _MIN_RTT, _DELIVERY_RATE, _RCV_OOOPACK = 68, 72, 100, 148, 160, 224
# Every field above in one call, for a struct that covers them all (Linux 5.4 and later).
_ALL = struct.Struct("=68xII24xI44xI8xQ56xI")
_BUFLEN = 256  # room for every field we read; the kernel copies min(its size, this)
_NO_SAMPLE = 0xFFFFFFFF  # tcpi_min_rtt before the first RTT sample
_U32_WRAP = 1 << 32
_IS_LINUX = sys.platform.startswith("linux") and hasattr(socket, "TCP_INFO")


@dataclass(frozen=True, slots=True, kw_only=True)
class TcpInfo:
    """One reading of a connection's `struct tcp_info`; None where the struct is too short."""

    rtt: float | None = None  # smoothed round-trip time, seconds
    rtt_var: float | None = None
    min_rtt: float | None = None  # windowed minimum RTT (the kernel skips suspected delayed ACKs)
    total_retrans: int | None = None  # segments this side retransmitted, connection lifetime
    delivery_rate: int | None = None  # bytes/s this side's data was delivered at (its latest sample)
    rcv_ooopack: int | None = None  # out-of-order packets received, connection lifetime

    @property
    def round_trip(self) -> float | None:
        """`min_rtt`, else the smoothed `rtt` (see `TcpStats.round_trip`)."""
        return self.min_rtt if self.min_rtt is not None else self.rtt


# The baseline of a connection opened for the request: its counters start at zero (SYN
# retransmits during connect count: the request waited for them).
NEW_CONNECTION = TcpInfo(total_retrans=0, rcv_ooopack=0)


def _u32(buf: bytes, offset: int) -> int | None:
    return _U32.unpack_from(buf, offset)[0] if len(buf) >= offset + 4 else None


def parse(buf: bytes) -> TcpInfo:
    """The fields of `struct tcp_info` that `buf` (as returned by getsockopt) covers."""
    if len(buf) >= _ALL.size:
        rtt, rtt_var, retrans, min_rtt, rate, ooo = _ALL.unpack_from(buf)
        return TcpInfo(
            rtt=rtt / 1e6,
            rtt_var=rtt_var / 1e6,
            min_rtt=None if min_rtt == _NO_SAMPLE else min_rtt / 1e6,
            total_retrans=retrans,
            delivery_rate=rate,
            rcv_ooopack=ooo,
        )
    rtt = _u32(buf, _RTT)
    rtt_var = _u32(buf, _RTTVAR)
    min_rtt = _u32(buf, _MIN_RTT)
    rate = _U64.unpack_from(buf, _DELIVERY_RATE)[0] if len(buf) >= _DELIVERY_RATE + 8 else None
    return TcpInfo(
        rtt=None if rtt is None else rtt / 1e6,
        rtt_var=None if rtt_var is None else rtt_var / 1e6,
        min_rtt=None if min_rtt is None or min_rtt == _NO_SAMPLE else min_rtt / 1e6,
        total_retrans=_u32(buf, _TOTAL_RETRANS),
        delivery_rate=rate,
        rcv_ooopack=_u32(buf, _RCV_OOOPACK),
    )


class _Socket(Protocol):
    def getsockopt(self, level: int, option: int, buflen: int) -> bytes: ...

    def fileno(self) -> int: ...


def _getsockopt(sock: _Socket) -> bytes:
    """`getsockopt(TCP_INFO)` of a socket or of what a transport hands out for one.

    uvloop's `PseudoSocket.getsockopt` wraps the descriptor in a `socket.socket` (its `__init__`
    and `detach` are Python code) for every call; a bare `_socket.socket` around the same
    descriptor, detached right after, runs none (docs/performance.md). Its family only steers
    address conversion, which getsockopt does not do, so AF_INET serves an IPv6 socket too;
    detaching leaves the descriptor to its owner, whatever happens in between.
    """
    if isinstance(sock, _socket.socket):  # a real socket (tests, clients): its own method is one C call
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _BUFLEN)
    probe = _socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, sock.fileno())
    try:
        return probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _BUFLEN)
    finally:
        probe.detach()


def read(sock: _Socket | None) -> TcpInfo | None:
    """`TCP_INFO` of `sock` now: one system call. None off Linux, for non-TCP or closed sockets."""
    if sock is None or not _IS_LINUX:
        return None
    try:
        buf = _getsockopt(sock)
    except (OSError, ValueError):  # closed (EBADF, fd -1), not TCP (EOPNOTSUPP), a detached fd
        return None
    return parse(buf) if len(buf) > _RTTVAR else None


@dataclass(frozen=True, slots=True, kw_only=True)
class TcpStats:
    """One request's upstream connection as the kernel saw it; crosses into spans and metrics."""

    rtt: float | None  # seconds, at the first token (else at the end)
    rtt_var: float | None
    min_rtt: float | None
    retransmits: int | None  # segments taotrace retransmitted during the request
    out_of_order: int | None  # packets received out of order during the request (loss upstream -> us)
    delivery_rate: int | None  # bytes/s, at the end

    @property
    def round_trip(self) -> float | None:
        """The one round trip a request pays: `min_rtt`, else the smoothed `rtt` (kernels < 4.6).

        Not the smoothed RTT first: its samples include the time the upstream delays its ACK of
        our request while it computes, so it grows with the server's work (docs/timing.md); a
        delayed ACK does not delay the response's bytes.
        """
        return self.min_rtt if self.min_rtt is not None else self.rtt


def _delta(end: int | None, start: int | None) -> int | None:
    if end is None or start is None:
        return None
    return (end - start) % _U32_WRAP  # u32 counters wrap


def request_stats(start: TcpInfo | None, first: TcpInfo | None, end: TcpInfo | None) -> TcpStats | None:
    """Combine a request's readings: RTT at its first token (else at its end), counters end − start.

    `start` is the connection's reading when the request took it (`NEW_CONNECTION` for a new
    one); None when unknown, and then the counters are too.
    """
    at = first or end
    if at is None:
        return None
    last = end or first
    assert last is not None
    return TcpStats(
        rtt=at.rtt,
        rtt_var=at.rtt_var,
        min_rtt=at.min_rtt,
        retransmits=_delta(last.total_retrans, start.total_retrans if start else None),
        out_of_order=_delta(last.rcv_ooopack, start.rcv_ooopack if start else None),
        delivery_rate=last.delivery_rate,
    )
