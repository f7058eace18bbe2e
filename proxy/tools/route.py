"""Which way the client tools (`probe`, `doctor`) reach a base URL: directly, or through the
forward proxy `HTTPS_PROXY` / `HTTP_PROXY` names, unless `NO_PROXY` (or loopback) says direct.

The decision is `serve`'s own (`proxy.config.envproxy.forward_proxy_for`: one set of rules); aiohttp
then does the connecting, as `serve`'s pool does: a `CONNECT host:port` tunnel with TLS to the
target inside it for https, absolute-form requests for http. The proxy's credentials travel as
`Proxy-Authorization` (on CONNECT for https, on each request for http) and are never shown:
every text here uses `ForwardProxy.where`, which has none.

What the timing split means then: "opening the connection" is TCP to the forward proxy (+ CONNECT
+ TLS through the tunnel for https), and the kernel's round trip is to the forward proxy; the
proxy's own leg to the target is in what is left, counted as the server's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from yarl import URL

from proxy.config.envproxy import ForwardProxy, bypassed, forward_proxy_for

__all__ = ["BAD_VARIABLE_FIX", "DIRECT", "ToolRoute", "os_reason", "route_for"]

_NO_PROXY = ("no_proxy", "NO_PROXY")
# What to do about a proxy variable `route_for` refuses (probe and doctor say it alike).
BAD_VARIABLE_FIX = "give it as http://[USER:PASSWORD@]host:port, or unset it to connect directly"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolRoute:
    """How a target is reached: `forward` is None for direct; `bypass` says why a proxy that is
    set was not used (`NO_PROXY` or loopback); `target` is `host:port`, for messages."""

    forward: ForwardProxy | None = None
    tunnel: bool = False  # https through the forward proxy: a CONNECT tunnel
    target: str = ""
    bypass: str | None = None

    @property
    def described(self) -> str:
        """Which way it goes, in words (no credentials)."""
        if self.forward is not None:
            return f"through the {self.forward.where}"
        return f"direct ({self.bypass})" if self.bypass else "direct"

    @property
    def connect_means(self) -> str:
        """What "opening the connection" covers on this route."""
        if self.forward is None:
            return "DNS, TCP, TLS"
        if self.tunnel:
            return "TCP to the forward proxy + CONNECT + TLS with the target through the tunnel"
        return "TCP to the forward proxy"

    def options(self, headers: Mapping[str, str]) -> dict[str, Any]:
        """Keyword arguments for an aiohttp request on this route, `headers` included."""
        if self.forward is None:
            return {"headers": dict(headers)}
        auth = {"Proxy-Authorization": self.forward.authorization} if self.forward.authorization else {}
        if self.tunnel:  # aiohttp sends `proxy_headers` on the CONNECT only
            return {"headers": dict(headers), "proxy": URL(self.forward.shown), "proxy_headers": auth}
        # absolute-form: aiohttp sends `proxy_headers` nowhere then, so the request carries them
        return {"headers": {**headers, **auth}, "proxy": URL(self.forward.shown)}

    def wants_credentials(self) -> tuple[str, str]:
        """The cause and fix for a 407 from the forward proxy."""
        assert self.forward is not None
        given = "refused the ones given" if self.forward.authorization else "none are set"
        return (
            f"the {self.forward.where} wants credentials (407 Proxy Authentication Required) and {given}",
            f"set {self.forward.variable}=http://USER:PASSWORD@{self.forward.shown.removeprefix('http://')}",
        )

    def refused(self, status: int, reason: str) -> tuple[str, str]:
        """The cause and fix when the forward proxy answers CONNECT with `status` (not 2xx)."""
        assert self.forward is not None
        if status == 407:
            return self.wants_credentials()
        answer = f"{status} {reason}".rstrip()
        if status >= 500:
            return (
                f"the {self.forward.where} could not open a tunnel to {self.target} ({answer}): "
                "the forward proxy is up, the target is unreachable from it",
                "check the host and port in --base-url; the target may be down, or blocked beyond the forward proxy",
            )
        return (
            f"the {self.forward.where} refused to open a tunnel to {self.target} ({answer})",
            f"its policy blocks {self.target}: ask its administrators, or list the host in NO_PROXY "
            "if it can be reached directly",
        )

    def unreachable(self, why: str) -> tuple[str, str]:
        """The cause and fix when the forward proxy itself cannot be reached."""
        assert self.forward is not None
        return (
            f"cannot connect to the {self.forward.where}: {why}",
            f"is the forward proxy up, and {self.forward.variable} right? "
            "(or list the host in NO_PROXY to connect directly)",
        )


DIRECT = ToolRoute()


def os_reason(exc: OSError) -> str:
    """`Connection refused`, not asyncio's `Connect call failed ('10.0.0.1', 3128)`."""
    return os.strerror(exc.errno) if exc.errno else type(exc).__name__


def route_for(url: URL, environ: Mapping[str, str]) -> ToolRoute:
    """The route to `url` under `environ`. Raises ValueError (naming the variable, never its
    credentials) for a proxy variable that cannot work, as `serve` does."""
    port = url.port or (443 if url.scheme == "https" else 80)
    host = url.raw_host or ""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    forward = forward_proxy_for(url, environ)
    if forward is not None:
        return ToolRoute(forward=forward, tunnel=url.scheme == "https", target=target)
    if bypassed(host, port, ""):
        variable = "https_proxy" if url.scheme == "https" else "http_proxy"
        proxy_set = any(environ.get(name, "").strip() for name in (variable, variable.upper()))
        return ToolRoute(target=target, bypass="loopback is never proxied" if proxy_set else None)
    try:  # would a proxy apply but for NO_PROXY? Then say so
        proxied = forward_proxy_for(url, {k: v for k, v in environ.items() if k not in _NO_PROXY}) is not None
    except ValueError:
        proxied = True  # set, though unusable: NO_PROXY makes it moot (serve does not object either)
    return ToolRoute(target=target, bypass=f"NO_PROXY matches {host}" if proxied else None)
