"""How a remote endpoint is named in a log line: `scheme://host:port`, never userinfo, path or query."""

from __future__ import annotations

from yarl import URL

__all__ = ["origin", "without_credentials"]


def origin(endpoint: str | URL) -> str:
    """`https://user:pw@api.example.com/v1?key=x` -> `https://api.example.com:443`. An endpoint
    without a scheme (a gRPC `host:port`) is named `host:port`; one that cannot be parsed, `?`."""
    text = str(endpoint)
    schemeless = "://" not in text
    try:
        url = URL("//" + text) if schemeless else URL(text)
        host, port = url.raw_host, url.port
    except ValueError:
        return "?"
    if not host:
        return "?"
    shown = f"[{host}]" if ":" in host else host
    where = shown if port is None else f"{shown}:{port}"
    return where if schemeless else f"{url.scheme}://{where}"


def without_credentials(url: URL) -> str:
    """The URL as it may be printed: its userinfo dropped (the rest is the user's own setting)."""
    return str(url.with_user(None))
