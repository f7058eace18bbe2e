"""The request target the proxy forwards: path and query as the client wrote them, refused when
it could reach outside the upstream's base path. Pure but for reading the request."""

from __future__ import annotations

from urllib.parse import unquote

from aiohttp import web

from proxy.errors import BadTarget

__all__ = ["climbs", "target"]


def target(request: web.BaseRequest) -> str:
    """Path and query as the client wrote them. Never anything that could change the host."""
    raw = request.raw_path
    if raw[:1] != "/":
        # Absolute-form target (`GET http://other/x`): keep only its path and query. Since the
        # result always follows the upstream's authority, nothing can change the host.
        raw = request.rel_url.raw_path_qs
        if raw[:1] != "/":
            raise BadTarget("the request target must be a path starting with '/'")
    path = raw.partition("?")[0]
    if ("." in path or "%" in path) and climbs(path):
        raise BadTarget("the request path must not contain '.' or '..' segments")
    return raw


def climbs(path: str) -> bool:
    r"""A `.` or `..` segment as some upstream may read it: forwarded after the upstream's base
    path, an upstream that resolves it would serve a path outside that base. Read the widest way:
    percent-decoded until it stops changing (`%2e%2e`, `..%2f`, `%252e`), `\` as `/` (Node's URL,
    IIS), and a segment's `;params` dropped (`..;/`: Tomcat, Jetty, Spring)."""
    for _ in range(3):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    return any(segment.partition(";")[0] in (".", "..") for segment in path.replace("\\", "/").split("/"))
