"""The request as it goes on the wire: the request line and headers, and which methods may retry."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["IDEMPOTENT", "authority", "request_head"]

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "DELETE", "CONNECT"})


def authority(host: str, port: int, scheme: str) -> str:
    """The `Host` value: the port only when it is not the scheme's default."""
    shown = f"[{host}]" if ":" in host else host
    default = 443 if scheme == "https" else 80
    return shown if port == default else f"{shown}:{port}"


def request_head(
    method: str, target: str, authority: str, headers: Iterable[tuple[str, str]], body: bytes, extra: str = ""
) -> bytes:
    """Request line and headers. `headers` are already filtered (no Host, framing or hop-by-hop);
    `extra`: lines of our own (a forward proxy's `Proxy-Authorization`)."""
    # Each (name, value) joined in C (`": ".join`): no Python-level step per header.
    fields = "\r\n".join(map(": ".join, headers))
    if fields:
        fields += "\r\n"
    framing = f"Content-Length: {len(body)}\r\n" if body or method not in _NO_BODY_METHODS else ""
    head = f"{method} {target} HTTP/1.1\r\nHost: {authority}\r\n{extra}{fields}{framing}\r\n"
    return head.encode("utf-8", "surrogateescape")
