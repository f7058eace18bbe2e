"""Listening sockets, bound before anything else starts, and the one way a refusal is told.

The long-running commands (`serve` in one process or as a group, `sim`, `demo`) bind every port
here first, before they build exporters or start workers, so a port that is taken, privileged
or on an address this host does not have stops the command at once with one line:

    cannot listen on 127.0.0.1:9464: address already in use (another taotrace running? choose another port with --metrics-port)

The flags named are the command's own (`CannotListen.named` renames them for a command that
calls another's `running`).
"""

from __future__ import annotations

import errno
import socket
import sys
from collections.abc import Sequence

__all__ = ["CannotListen", "bind", "http_url", "refusal"]


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_url(host: str, port: int) -> str:
    """`http://host:port` for a bound address (an IPv6 one in brackets)."""
    return f"http://{_where(host, port)}"


def refusal(host: str, port: int, error: OSError, *, port_flag: str, host_flag: str) -> str:
    """The one line said when `host:port` cannot be listened on (every command says it so)."""
    where = _where(host, port)
    if isinstance(error, socket.gaierror):
        return f"cannot listen on {where}: unknown host (change {host_flag})"
    if error.errno == errno.EADDRINUSE:
        why = f"address already in use (another taotrace running? choose another port with {port_flag})"
    elif error.errno == errno.EACCES:
        why = f"permission denied (ports below 1024 need privileges; choose another port with {port_flag})"
    elif error.errno == errno.EADDRNOTAVAIL:
        why = f"cannot assign requested address (not an address of this host; change {host_flag})"
    else:
        why = f"{(error.strerror or str(error)).lower()} (check {host_flag} and {port_flag})"
    return f"cannot listen on {where}: {why}"


class CannotListen(OSError):
    """A port that cannot be listened on; `str()` is the one line users see (`refusal`)."""

    def __init__(self, host: str, port: int, error: OSError, *, port_flag: str, host_flag: str) -> None:
        super().__init__(error.errno, error.strerror)
        self.host, self.port, self.error = host, port, error
        self.port_flag, self.host_flag = port_flag, host_flag

    def __str__(self) -> str:
        return refusal(self.host, self.port, self.error, port_flag=self.port_flag, host_flag=self.host_flag)

    def named(self, *, port_flag: str | None = None, host_flag: str | None = None) -> CannotListen:
        """The same refusal, naming another command's flags."""
        return CannotListen(
            self.host,
            self.port,
            self.error,
            port_flag=port_flag or self.port_flag,
            host_flag=host_flag or self.host_flag,
        )


def _addresses(host: str, port: int) -> list[tuple[int, int, int, tuple[object, ...]]]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    seen: list[tuple[int, int, int, tuple[object, ...]]] = []
    for family, kind, proto, _, address in infos:
        if (family, kind, proto, address) not in seen:
            seen.append((family, kind, proto, address))
    return seen


def _bind_one(family: int, kind: int, proto: int, address: tuple[object, ...], *, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        # As asyncio's create_server does: a restart is not refused for the last run's TIME_WAITs,
        # and an IPv6 socket leaves the IPv4 one its own address.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def _close(socks: Sequence[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def bind(
    host: str,
    port: int,
    *,
    port_flag: str,
    host_flag: str,
    backlog: int | None = 128,
    reuse_port: bool = False,
    exclusive: bool = False,
) -> list[socket.socket]:
    """Bind `host:port` (every address `host` resolves to; port 0: one free port for all) and
    listen with `backlog` (None: bind only, to hold the port). Raises `CannotListen`.

    `reuse_port`: SO_REUSEPORT, so worker processes can bind the same port and the kernel
    spreads connections over them (Linux). `exclusive`: refuse a port that any other socket
    listens on, even one of another process sharing it with SO_REUSEPORT (two groups on one
    port would silently split the traffic)."""
    if reuse_port and (not hasattr(socket, "SO_REUSEPORT") or sys.platform != "linux"):
        raise OSError("--workers > 1 needs SO_REUSEPORT (Linux); run one process per replica instead")
    socks: list[socket.socket] = []
    try:
        addresses = _addresses(host, port)
        if exclusive and port != 0:
            _close([_bind_one(*a, reuse_port=False) for a in addresses])  # only to see that nobody holds it
        for family, kind, proto, address in addresses:
            if port == 0 and socks:  # the first bind chose the port: the others take the same
                address = (address[0], socks[0].getsockname()[1], *address[2:])
            socks.append(_bind_one(family, kind, proto, address, reuse_port=reuse_port))
            if backlog is not None:
                socks[-1].listen(backlog)
    except OSError as exc:
        _close(socks)
        raise CannotListen(host, port, exc, port_flag=port_flag, host_flag=host_flag) from None
    for sock in socks:
        sock.setblocking(False)
    return socks
