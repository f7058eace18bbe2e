"""Pure header rules for both directions of the proxy (RFC 9110 §7.6.1 hop-by-hop handling).

The client's `Host`, framing headers and hop-by-hop headers never cross; `Authorization`,
`x-api-key` and everything else end-to-end pass untouched. `--forwarded-for` says what the proxy
adds of the client's address (`ForwardedFor`): appended to `X-Forwarded-For` (the default), this
hop appended to `Forwarded` (RFC 7239), or nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict

from proxy.config.settings import ForwardedFor

__all__ = ["HOP_BY_HOP", "ForwardedFor", "request_headers", "response_headers"]

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
# What the proxy adds of the client's address: see the module docstring and docs/settings.md.
# Never copied: aiohttp frames each side itself, and the upstream's Host is its own.
_FRAMING = frozenset({"content-length", "host", "expect"})
_DROP = HOP_BY_HOP | _FRAMING
_XFF = "x-forwarded-for"
_FORWARDED = "forwarded"
_DROP_OR_XFF = _DROP | {_XFF}
_DROP_OR_FORWARDED = _DROP | {_FORWARDED}
_DROP_EMPTY = _DROP | {""}  # and the empty names of `Connection: a,,b`


def _filter(
    headers: Iterable[tuple[str, str]], prior: list[str] | None = None, taken: str = "", drop: frozenset[str] = _DROP
) -> list[tuple[str, str]]:
    """The end-to-end headers, in order: one pass, each name lowered once (this runs twice per
    request); the headers a `Connection` header names are dropped after it. `prior`: when given,
    the values of the header `taken` (in `drop` too) are taken out into it (in the same pass)."""
    kept: list[tuple[str, str]] = []
    named: set[str] | None = None
    for key, value in headers:
        lower = key.lower()
        if lower in drop:
            if lower == "connection":
                if named is None:
                    named = set()
                for token in value.lower().split(","):
                    named.add(token.strip())
            elif lower == taken:
                prior.append(value)  # type: ignore[union-attr]  # in `drop` only when given
            continue
        kept.append((key, value))
    if named:
        named -= _DROP_EMPTY  # `Connection: keep-alive` (most clients) names only what is gone already
    if named:
        kept = [(key, value) for key, value in kept if key.lower() not in named]
        if prior and taken in named:
            prior.clear()
    return kept


def request_headers(
    headers: Iterable[tuple[str, str]], peer: str | None, forwarded_for: ForwardedFor = "append"
) -> CIMultiDict[str]:
    """Headers to send upstream for a client's request that came from `peer` (None or "": a Unix
    socket, nothing added). The client's values of the header the proxy adds to go first, in one
    header with the proxy's value last."""
    if not peer or forwarded_for == "off":
        return CIMultiDict(_filter(headers))
    prior: list[str] = []
    if forwarded_for == "append":
        kept = _filter(headers, prior, _XFF, _DROP_OR_XFF)
        kept.append(("X-Forwarded-For", f"{', '.join(prior)}, {peer}" if prior else peer))
    else:
        kept = _filter(headers, prior, _FORWARDED, _DROP_OR_FORWARDED)
        # RFC 7239 §6: an IPv6 node is bracketed, and then (`:` and `[` are not token characters) quoted.
        node = f'for="[{peer}]"' if ":" in peer else f"for={peer}"
        kept.append(("Forwarded", f"{', '.join(prior)}, {node}" if prior else node))
    return CIMultiDict(kept)


def response_headers(headers: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
    """Headers to send the client for the upstream's response."""
    return CIMultiDict(_filter(headers))
