"""Several upstreams behind one proxy: `--route [NAME:]/PREFIX=URL`. Pure: no I/O.

The longest prefix that matches the request path on a segment boundary picks the route
(`/anthropic` matches `/anthropic/v1/messages` and `/anthropic`, never `/anthropicx`); the prefix
is stripped and the rest follows the route's base URL. `--upstream` is the route for `/` unless a
`--route /=URL` is given (`taotrace serve` refuses both at once: see `default_route_conflict`).

A route's name is the `upstream` label of its metrics, spans and live-view rows: chosen by the
operator, or derived from the configuration alone (`derived_names`), so the label stays as bounded
as the configuration and the same for the same one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from yarl import URL

__all__ = [
    "DEFAULT_UPSTREAM", "Route", "Router", "default_route_conflict", "derived_names", "parse_route", "routes_for", "upstream_url",
]  # fmt: skip

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_SPEC = re.compile(r"^(?:([^:/=]+):)?(/[^=]*)=(.+)$")
_PREFIX = re.compile(r"^(/[A-Za-z0-9._~!$&'()*+,;@%-]+)*$")  # segments of a path, no `?`, `#`, `=`, empty segment
DEFAULT_UPSTREAM = "https://taotoken.net/api"
EXAMPLE = "--route /anthropic=https://api.anthropic.com or --route claude:/anthropic=https://api.anthropic.com"


@dataclass(frozen=True, slots=True)
class Route:
    """Requests under `prefix` go to `url` (its path in front of the rest); `name` labels them."""

    name: str
    prefix: str  # "" for the root route, else "/a" or "/a/b" (no trailing slash)
    url: URL

    @property
    def host(self) -> str:
        return self.url.host or ""

    @property
    def port(self) -> int:
        return self.url.port or 0

    @property
    def base(self) -> str:
        """The base URL without a trailing slash, for `url.full`."""
        return str(self.url).rstrip("/")

    @property
    def base_path(self) -> str:
        """The base URL's path (e.g. "/api"), what the rest of a request path is appended to."""
        return self.url.raw_path.rstrip("/")

    @property
    def shown_prefix(self) -> str:
        return self.prefix or "/"


def upstream_url(raw: str) -> URL:
    """The upstream base URL, validated: http(s), a host, no query string or fragment."""
    try:
        url = URL(raw)
    except ValueError:
        raise ValueError(f"not a URL: {raw!r} (expected e.g. {DEFAULT_UPSTREAM})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"upstream must be an http(s) URL with a host, e.g. {DEFAULT_UPSTREAM}")
    if url.query_string or url.fragment:
        raise ValueError("upstream must not carry a query string or fragment")
    return url


def _name_of(url: URL) -> str:
    return (url.host or "upstream").lower()


def _host_port(url: URL) -> str:
    host = _name_of(url)
    return f"[{host}]:{url.port}" if ":" in host else f"{host}:{url.port}"  # an IPv6 address bracketed


def _parse(spec: str) -> tuple[str | None, str, URL]:
    """`[NAME:]/PREFIX=URL` -> (the NAME given or None, prefix, URL); ValueError as `parse_route`."""
    m = _SPEC.match(spec.strip())
    if m is None:
        raise ValueError(f"not a route: {spec[:80]!r}; expected e.g. {EXAMPLE}")
    name, prefix, raw = m.group(1), m.group(2).rstrip("/"), m.group(3).strip()
    if not _PREFIX.match(prefix):
        raise ValueError(f"route prefix {m.group(2)[:60]!r} must be a path such as /anthropic (no ?, #, = or //)")
    url = upstream_url(raw)
    if name is not None:
        name = name.strip().lower()
        if not _NAME.match(name):
            raise ValueError(
                f"route name {name[:40]!r} must be 1-63 characters: lowercase letters, digits, '.', '_', '-' "
                "(a metric label)"
            )
    return name, prefix, url


def parse_route(spec: str) -> Route:
    """`[NAME:]/PREFIX=URL` -> Route, named NAME or, alone, its URL's host (`routes_for` names a
    route among the others). Raises ValueError saying what is wrong and the form expected."""
    name, prefix, url = _parse(spec)
    return Route(name if name is not None else _name_of(url), prefix, url)


def derived_names(unnamed: Sequence[tuple[str, URL]], taken: Iterable[str] = ()) -> list[str]:
    """Names for routes given none, from (prefix, URL) pairs with distinct prefixes: the URL's
    host where no other of them has that host and no route was given it as its name (`taken`);
    else `host:port` where that tells them apart; else `/prefix=host:port`, which the prefix makes
    unique. Depends on the configuration alone, so the same routes get the same names."""
    taken = set(taken)
    hosts = Counter(_name_of(url) for _, url in unnamed)
    names = [_name_of(url) for _, url in unnamed]
    clashing = [i for i, name in enumerate(names) if hosts[name] > 1 or name in taken]
    host_ports = Counter(_host_port(unnamed[i][1]) for i in clashing)
    for i in clashing:
        prefix, url = unnamed[i]
        name = _host_port(url)
        names[i] = name if host_ports[name] == 1 else f"{prefix or '/'}={name}".lower()
    # Only prefixes that differ in case alone can still meet (a name is lowercase): numbered, in order.
    seen: set[str] = set(taken)
    for i, name in enumerate(names):
        n = 1
        while names[i] in seen:
            n += 1
            names[i] = f"{name}-{n}"
        seen.add(names[i])
    return names


def routes_for(upstream: str, specs: Iterable[str]) -> tuple[Route, ...]:
    """The routes of a proxy: each `--route`, and `--upstream` for `/` unless a route claims it;
    the unnamed ones named by `derived_names`. Raises ValueError on two routes with one prefix,
    or two given one name."""
    parsed = [_parse(s) for s in specs]
    if not any(prefix == "" for _, prefix, _ in parsed):
        parsed.append((None, "", upstream_url(upstream)))
    by_prefix: set[str] = set()
    by_name: dict[str, str] = {}
    for name, prefix, _ in parsed:
        shown = prefix or "/"
        if prefix in by_prefix:
            raise ValueError(f"two routes for the prefix {shown}; give each prefix once")
        by_prefix.add(prefix)
        if name is not None:
            if name in by_name:
                raise ValueError(
                    f"two routes are named {name!r} ({by_name[name]} and {shown}); give each route its own name"
                )
            by_name[name] = shown
    unnamed = [(prefix, url) for name, prefix, url in parsed if name is None]
    derived = iter(derived_names(unnamed, by_name))
    return tuple(Route(name if name is not None else next(derived), prefix, url) for name, prefix, url in parsed)


def default_route_conflict(upstream_given: bool, specs: Iterable[str]) -> str | None:
    """Why `--upstream` and `--route /=URL` together are refused (None: they are not both given)."""
    if upstream_given and any(parse_route(s).prefix == "" for s in specs):
        return (
            "--upstream and --route /=URL both name the upstream for every other path; "
            "give one of them (TAOTRACE_UPSTREAM counts as --upstream)"
        )
    return None


T = TypeVar("T")


class Router(Generic[T]):
    """Picks what serves a request target: the longest prefix matching on a segment boundary."""

    __slots__ = ("_by_prefix", "_lengths", "only")

    def __init__(self, entries: Sequence[tuple[Route, T]]) -> None:
        if not any(route.prefix == "" for route, _ in entries):
            raise ValueError("a router needs a route for / (routes_for adds --upstream)")
        self._by_prefix = {route.prefix: value for route, value in entries}
        self._lengths = sorted({len(p) for p in self._by_prefix}, reverse=True)
        # One root route and nothing else (today's proxy): no lookup per request.
        self.only = entries[0][1] if len(entries) == 1 and entries[0][0].prefix == "" else None

    def match(self, target: str) -> tuple[T, str]:
        """(what serves `target`, the target without the prefix); the route for / when no other matches.

        `target` is the path and query as the client sent them (`/a/v1/x?y=1`)."""
        only = self.only
        if only is not None:
            return only, target
        by_prefix = self._by_prefix
        path_end = len(target)
        for sep in "?#":
            i = target.find(sep)
            if i != -1:
                path_end = min(path_end, i)
        for n in self._lengths:
            if n > path_end:
                continue
            if n < path_end and target[n] != "/":
                continue  # not a segment boundary: /anthropic never matches /anthropicx
            found = by_prefix.get(target[:n])
            if found is not None:
                rest = target[n:]
                return found, rest if rest[:1] == "/" else "/" + rest
        raise AssertionError("unreachable: the route for / matches every target")
