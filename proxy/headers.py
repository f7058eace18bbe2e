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
_XFF = "x-forwarded-for"
_DROP_OR_XFF = _DROP | {_XFF}
_DROP_EMPTY = _DROP | {""}  # and the empty names of `Connection: a,,b`


def _filter(headers: Iterable[tuple[str, str]], forwarded: list[str] | None = None) -> list[tuple[str, str]]:
    """The end-to-end headers, in order: one pass, each name lowered once (this runs twice per
    request); the headers a `Connection` header names are dropped after it. `forwarded`: when
    given, the `X-Forwarded-For` values are taken out into it (in the same pass)."""
    kept: list[tuple[str, str]] = []
    named: set[str] | None = None
    drop = _DROP if forwarded is None else _DROP_OR_XFF
    for key, value in headers:
        lower = key.lower()
        if lower in drop:
            if lower == "connection":
                if named is None:
                    named = set()
                for token in value.lower().split(","):
                    named.add(token.strip())
            elif lower == _XFF:
                forwarded.append(value)  # type: ignore[union-attr]  # in `drop` only when given
            continue
        kept.append((key, value))
    if named:
        named -= _DROP_EMPTY  # `Connection: keep-alive` (most clients) names only what is gone already
    if named:
        kept = [(key, value) for key, value in kept if key.lower() not in named]
        if forwarded and _XFF in named:
            forwarded.clear()
    return kept


def request_headers(headers: Iterable[tuple[str, str]], peer: str | None) -> CIMultiDict[str]:
    """Headers to send upstream for a client's request that came from `peer`."""
    if not peer:
        return CIMultiDict(_filter(headers))
    prior: list[str] = []
    kept = _filter(headers, prior)  # the client's X-Forwarded-For, taken out: ours goes last
    kept.append(("X-Forwarded-For", f"{', '.join(prior)}, {peer}" if prior else peer))
    return CIMultiDict(kept)


def response_headers(headers: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
    """Headers to send the client for the upstream's response."""
    return CIMultiDict(_filter(headers))
