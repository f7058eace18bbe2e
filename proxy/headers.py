"""Pure header rules for both directions of the proxy (RFC 9110 §7.6.1 hop-by-hop handling).

The client's `Host`, framing headers and hop-by-hop headers never cross; `Authorization`,
`x-api-key` and everything else end-to-end pass untouched; `X-Forwarded-For` is appended to.
"""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict

__all__ = ["HOP_BY_HOP", "request_headers", "response_headers"]

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Never copied: aiohttp frames each side itself, and the upstream's Host is its own.
_FRAMING = frozenset({"content-length", "host", "expect"})
_DROP = HOP_BY_HOP | _FRAMING


def _connection_named(headers: Iterable[tuple[str, str]]) -> frozenset[str]:
    names: set[str] = set()
    for key, value in headers:
        if key.lower() == "connection":
            names.update(token.strip().lower() for token in value.split(",") if token.strip())
    return frozenset(names)


def _filter(headers: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
    items = list(headers)
    drop = _DROP | _connection_named(items) if any(k.lower() == "connection" for k, _ in items) else _DROP
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in items:
        if key.lower() not in drop:
            out.add(key, value)
    return out


def request_headers(headers: Iterable[tuple[str, str]], peer: str | None) -> CIMultiDict[str]:
    """Headers to send upstream for a client's request that came from `peer`."""
    out = _filter(headers)
    if peer:
        prior = ", ".join(out.getall("X-Forwarded-For", ()))
        out.popall("X-Forwarded-For", None)
        out["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
    return out


def response_headers(headers: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
    """Headers to send the client for the upstream's response."""
    return _filter(headers)
