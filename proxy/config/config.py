"""One configuration per start: the settings, parsed and checked once (`load`), then passed down.

    settings        the values as given (flags, `TAOTRACE_*` variables, defaults)
    routes          every route (`--route`, and `--upstream` for `/`), named; `root` serves `/`
    forward         the forward proxy each route's upstream is reached through (`HTTPS_PROXY`, ...)
    accounting      attribution, prices and metric labels (one key salt for a whole group)
    slow_ttft, slow_duration   `--keep-slower-than`, in seconds
    mirror_key      the mirror's key, from the variable `--mirror-key-env` names

Everything that can be wrong with a start is found here, as one line for the operator; nothing
later re-reads the environment for these or parses a setting again. A group's workers each load
their own from the settings their supervisor hands them (the same key salt among them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.config.accounting import Accounting, accounting_from
from proxy.config.envproxy import ForwardProxy, forward_proxy_for
from proxy.config.routes import Route, default_route_conflict, routes_for
from proxy.config.settings import Settings, parse_thresholds

__all__ = ["Config", "load"]


@dataclass(frozen=True, slots=True)
class Config:
    """A start's configuration (see the module's docstring)."""

    settings: Settings
    routes: tuple[Route, ...]
    forward: tuple[ForwardProxy | None, ...]  # one per route, in the same order
    accounting: Accounting
    slow_ttft: float | None = None
    slow_duration: float | None = None
    mirror_key: str | None = None

    @property
    def root(self) -> Route:
        """The route for `/`: where a request no other route claims goes."""
        return next(r for r in self.routes if r.prefix == "")

    def route(self, name: str) -> Route:
        """The route called `name` (route names are lower case)."""
        return next(r for r in self.routes if r.name == name.lower())

    def forward_proxy(self, route: Route) -> ForwardProxy | None:
        return self.forward[self.routes.index(route)]


def load(
    settings: Settings, environ: Mapping[str, str] = os.environ, *, accounting: Accounting | None = None
) -> Config:
    """The configuration of `settings`, checked once. Raises ValueError with a line for the
    operator (never quoting a credential). `accounting`: one already built (a group's, whose key
    salt its workers share), else built here."""
    conflict = default_route_conflict("upstream" in settings.model_fields_set, settings.routes)
    if conflict is not None:
        raise ValueError(conflict)
    routes = routes_for(settings.upstream, settings.routes)
    forward = tuple(forward_proxy_for(r.url, environ) for r in routes)  # a bad HTTPS_PROXY, by name
    slow_ttft, slow_duration = parse_thresholds(settings.keep_slower_than)
    mirror_key = None
    if settings.mirror is not None:
        names = [r.name for r in routes]
        if settings.mirror.lower() not in names:
            raise ValueError(f"--mirror {settings.mirror[:40]!r} names no route; the routes: {', '.join(names)}")
        if settings.mirror_key_env:
            mirror_key = environ.get(settings.mirror_key_env)
            if not mirror_key:
                raise ValueError(f"--mirror-key-env names {settings.mirror_key_env}, which is not set")
    return Config(
        settings=settings,
        routes=routes,
        forward=forward,
        accounting=accounting_from(settings) if accounting is None else accounting,
        slow_ttft=slow_ttft,
        slow_duration=slow_duration,
        mirror_key=mirror_key,
    )
