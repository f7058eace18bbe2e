"""Start-up mistakes the proxy can see in its first requests, told once in the log.

Forwarding never changes because of them: the proxy stays transparent, the log says what to fix.

An upstream given *with* the path the clients already send. With
`--upstream http://127.0.0.1:8000/v1` and clients on `http://127.0.0.1:8787/v1`, a request for
`/v1/chat/completions` goes to `http://127.0.0.1:8000/v1/v1/chat/completions`, which no server
answers (a 404 whose cause is far from obvious): `DoubledPrefix` sees it in the first requests.
One given with an endpoint's path glued on (`…/v1/chat/completions`) is plain at start:
`endpoint_suffix`.
"""

from __future__ import annotations

import logging

from yarl import URL

__all__ = ["ENDPOINT_SUFFIXES", "DoubledPrefix", "endpoint_suffix"]

WATCH_REQUESTS = 100  # after this many requests without the mistake, stop looking
# The endpoints clients append to their base URL (the dialects' paths, and the model list).
ENDPOINT_SUFFIXES = ("/chat/completions", "/completions", "/responses", "/messages", "/embeddings", "/models")


def endpoint_suffix(upstream: URL) -> str | None:
    """A warning when the upstream's path ends with an endpoint's path, which clients add themselves."""
    path = upstream.path.rstrip("/")
    for suffix in ENDPOINT_SUFFIXES:
        if path.endswith(suffix):
            base = str(upstream.with_user(None).with_query(None)).rstrip("/")  # never a password in the log
            root = base[: -len(suffix)]
            # Clients send /v1/... themselves: an upstream ending in /v1 would double it (DoubledPrefix).
            root = root.removesuffix("/v1")
            return (
                f"the upstream {base} ends with the endpoint path {suffix}, which clients add to their base URL "
                f"themselves: a request for /v1{suffix} goes to {base}/v1{suffix}. Start the proxy with "
                f"--upstream {root} and give clients the proxy's address with /v1 as their base URL "
                "(forwarding is unchanged)."
            )
    return None


class DoubledPrefix:
    """Warns once when requests start with the segment the upstream's path ends with (`/v1`)."""

    __slots__ = ("_left", "_log", "_upstream", "segment")

    def __init__(self, upstream: URL, log: logging.Logger) -> None:
        self._upstream = upstream
        self._log = log
        self.segment = upstream.path.rstrip("/").rsplit("/", 1)[-1]
        self._left = WATCH_REQUESTS if self.segment else 0

    @property
    def watching(self) -> bool:
        return self._left > 0

    def see(self, path: str, host: str) -> None:
        """One request's path (and its Host header, to name the proxy as the client sees it)."""
        self._left -= 1
        if path.split("/", 2)[1:2] != [self.segment]:
            return
        self._left = 0
        base = str(self._upstream.with_user(None).with_query(None)).rstrip("/")  # never a password in the log
        fixed = base[: -len(self.segment) - 1]
        self._log.warning(
            "the upstream %s ends in /%s and requests arrive as %s, so they are forwarded to %s%s, "
            "which the upstream likely does not serve. Start the proxy with --upstream %s "
            "(clients keep their base URL http://%s/%s), or give the clients the base URL http://%s. "
            "(Told once; forwarding is unchanged.)",
            base, self.segment, path, base, path, fixed, host, self.segment, host,
        )  # fmt: skip
