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


def _filter(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The end-to-end headers, in order: one pass, each name lowered once (this runs twice per
    request); the headers a `Connection` header names are dropped after it."""
    kept: list[tuple[str, str]] = []
    named: set[str] | None = None
    for key, value in headers:
        lower = key.lower()
        if lower in _DROP:
            if lower == "connection":
                if named is None:
                    named = set()
                named.update(token.strip().lower() for token in value.split(",") if token.strip())
            continue
        kept.append((key, value))
    if named:
        kept = [(key, value) for key, value in kept if key.lower() not in named]
    return kept


def request_headers(headers: Iterable[tuple[str, str]], peer: str | None) -> CIMultiDict[str]:
    """Headers to send upstream for a client's request that came from `peer`."""
    out = CIMultiDict(_filter(headers))
    if peer:
        prior = ", ".join(out.getall("X-Forwarded-For", ()))
        out.popall("X-Forwarded-For", None)
        out["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
    return out


def response_headers(headers: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
    """Headers to send the client for the upstream's response."""
    return CIMultiDict(_filter(headers))
