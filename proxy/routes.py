"""Several upstreams behind one proxy: `--route [NAME:]/PREFIX=URL`. Pure: no I/O.

The longest prefix that matches the request path on a segment boundary picks the route
(`/anthropic` matches `/anthropic/v1/messages` and `/anthropic`, never `/anthropicx`); the prefix
is stripped and the rest follows the route's base URL. `--upstream` is the route for `/` unless a
`--route /=URL` is given (`taotrace serve` refuses both at once: see `default_route_conflict`).

A route's name is the `upstream` label of its metrics, spans and live-view rows: chosen by the
operator (or the upstream's host), so the label stays as bounded as the configuration.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from yarl import URL

__all__ = ["Route", "Router", "default_route_conflict", "parse_route", "routes_for"]

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_SPEC = re.compile(r"^(?:([^:/=]+):)?(/[^=]*)=(.+)$")
_PREFIX = re.compile(r"^(/[A-Za-z0-9._~!$&'()*+,;@%-]+)*$")  # segments of a path, no `?`, `#`, `=`, empty segment
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


def _url(raw: str) -> URL:
    # Imported here: settings imports this module to validate --route.
    from proxy.settings import upstream_url

    return upstream_url(raw)


def _name_of(url: URL) -> str:
    return (url.host or "upstream").lower()


def parse_route(spec: str) -> Route:
    """`[NAME:]/PREFIX=URL` -> Route. Raises ValueError saying what is wrong and the form expected."""
    m = _SPEC.match(spec.strip())
    if m is None:
        raise ValueError(f"not a route: {spec[:80]!r}; expected e.g. {EXAMPLE}")
    name, prefix, raw = m.group(1), m.group(2).rstrip("/"), m.group(3).strip()
    if not _PREFIX.match(prefix):
        raise ValueError(f"route prefix {m.group(2)[:60]!r} must be a path such as /anthropic (no ?, #, = or //)")
    url = _url(raw)
    name = name.strip().lower() if name is not None else _name_of(url)
    if not _NAME.match(name):
        raise ValueError(
            f"route name {name[:40]!r} must be 1-63 characters: lowercase letters, digits, '.', '_', '-' (a metric label)"
        )
    return Route(name, prefix, url)


def routes_for(upstream: str, specs: Iterable[str]) -> tuple[Route, ...]:
    """The routes of a proxy: each `--route`, and `--upstream` for `/` unless a route claims it.
    Raises ValueError on two routes with one prefix or one name."""
    routes = [parse_route(s) for s in specs]
    if not any(r.prefix == "" for r in routes):
        url = _url(upstream)
        routes.append(Route(_name_of(url), "", url))
    by_prefix: dict[str, Route] = {}
    by_name: dict[str, Route] = {}
    for r in routes:
        if r.prefix in by_prefix:
            raise ValueError(f"two routes for the prefix {r.shown_prefix}; give each prefix once")
        if r.name in by_name:
            raise ValueError(
                f"two routes are named {r.name!r} ({by_name[r.name].shown_prefix} and {r.shown_prefix}); "
                "name them: --route NAME:/prefix=URL"
            )
        by_prefix[r.prefix] = by_name[r.name] = r
    return tuple(routes)


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
