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

from proxy.logs.origin import without_credentials

__all__ = ["ENDPOINT_SUFFIXES", "DoubledPrefix", "endpoint_suffix"]

WATCH_REQUESTS = 100  # after this many requests without the mistake, stop looking
# The endpoints clients append to their base URL: the dialects' paths. (Not `/models`: a few
# gateways' bases end so, e.g. Hugging Face's legacy inference API.)
ENDPOINT_SUFFIXES = ("/chat/completions", "/completions", "/responses", "/messages", "/embeddings")


def endpoint_suffix(upstream: URL) -> str | None:
    """A warning when the upstream's path ends with an endpoint's path, which clients add themselves."""
    path = upstream.path.rstrip("/")
    for suffix in ENDPOINT_SUFFIXES:
        if path.endswith(suffix):
            # An upstream has no query or fragment (settings.upstream_url refuses them).
            base = without_credentials(upstream).rstrip("/")
            root = without_credentials(upstream.with_path(path[: -len(suffix)])).rstrip("/")
            # An endpoint URL copied whole (`…/v1/chat/completions`): the clients send `/v1` themselves.
            root = root.removesuffix("/v1")
            return (
                f"the upstream {base} ends with the endpoint path {suffix}, which clients add themselves: each "
                f"request goes to it followed by the client's own path ({suffix} twice). Start the proxy with "
                f"--upstream {root}, and point clients at the proxy as they would at {root} "
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
