"""Which forward proxy (if any) the upstream is reached through: `HTTPS_PROXY`, `HTTP_PROXY`,
`NO_PROXY`, read as curl, requests and aiohttp's `trust_env` read them. Pure: environment in,
a `ForwardProxy` (or None) out; `proxy/upstream/` does the connecting.

- An `https://` upstream uses `https_proxy`, else `HTTPS_PROXY`; an `http://` one `http_proxy`,
  else `HTTP_PROXY` (the lower-case name wins when both are set, as in Python's urllib and
  requests). `ALL_PROXY` is not read (aiohttp did not read it either; it is often a SOCKS proxy).
- The proxy URL is `http://[user:password@]host[:port]` (no scheme means http; port 80 by
  default, as curl). Only plain-HTTP forward proxies are supported: an `https://` or `socks*://`
  one is refused at start with a message naming the variable.
- `no_proxy`, else `NO_PROXY`: entries separated by commas (or spaces). `*` alone: no proxy for
  anything. A name matches itself and its subdomains, with or without a leading dot
  (`example.com` and `.example.com` both match `api.example.com` and `example.com`). An IP
  matches itself; a CIDR block (`10.0.0.0/8`, `fd00::/8`) the addresses in it. `name:port`
  matches only that port. Matching is case-insensitive.
- `localhost` and loopback addresses (127.0.0.0/8, ::1) are always reached directly, as Go's
  net/http does: a proxy elsewhere cannot reach this machine's loopback. So are the unspecified
  addresses (0.0.0.0, ::): to connect to one is to reach this machine (the URL of a server bound
  to all interfaces, as `taotrace demo --host 0.0.0.0` gives its simulator).

Credentials in the proxy URL are sent as `Proxy-Authorization: Basic ...` and never shown:
`ForwardProxy.shown` and every message use the URL without them.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from yarl import URL

__all__ = ["ForwardProxy", "bypassed", "forward_proxy_for"]

_SPLIT = re.compile(r"[,\s]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardProxy:
    """A forward proxy to reach the upstream through, and where that came from."""

    host: str
    port: int
    variable: str  # the environment variable it was read from, for messages
    authorization: str | None = field(default=None, repr=False)  # the Proxy-Authorization value

    @property
    def shown(self) -> str:
        """The proxy as it may be printed: no credentials."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def where(self) -> str:
        return f"forward proxy {self.shown} (from {self.variable})"


def _lookup(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    for variable in (name.lower(), name.upper()):
        value = environ.get(variable, "").strip()
        if value:
            return variable, value
    return None


def _parse(variable: str, raw: str) -> ForwardProxy:
    text = raw if "://" in raw else "http://" + raw
    try:
        url = URL(text)
    except ValueError:
        raise ValueError(f"{variable} is not a URL") from None
    if url.scheme != "http":
        raise ValueError(
            f"{variable} uses a {url.scheme}:// proxy; only http:// forward proxies are supported "
            "(for an https upstream the tunnel to it is still TLS end to end)"
        )
    if not url.raw_host:
        raise ValueError(f"{variable} has no host")
    authorization = None
    if url.raw_user is not None:
        pair = f"{unquote(url.raw_user)}:{unquote(url.raw_password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
    return ForwardProxy(host=url.raw_host, port=url.explicit_port or 80, variable=variable, authorization=authorization)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def _entry_matches(
    entry: str, host: str, port: int, address: ipaddress.IPv4Address | ipaddress.IPv6Address | None
) -> bool:
    entry = entry.lower()
    if entry.startswith("[") and "]" in entry:  # [::1] or [::1]:8080
        name, _, rest = entry[1:].partition("]")
        entry_port = rest.removeprefix(":") or None
    elif entry.count(":") == 1:  # name:port or v4:port (a bare IPv6 has several colons)
        name, entry_port = entry.split(":")
    else:
        name, entry_port = entry, None
    if entry_port is not None and entry_port != str(port):
        return False
    if "/" in name:
        try:
            return address is not None and address in ipaddress.ip_network(name, strict=False)
        except ValueError:
            return False
    entry_ip = _ip(name)
    if entry_ip is not None:
        return address == entry_ip
    name = name.lstrip(".")
    return bool(name) and (host == name or host.endswith("." + name))


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether `host:port` is reached directly under this `NO_PROXY` value (this machine always is)."""
    host = host.lower().strip("[]").rstrip(".")
    address = _ip(host)
    if host == "localhost" or host.endswith(".localhost"):
        return True
    if address is not None and (address.is_loopback or address.is_unspecified):
        return True
    entries = [e for e in _SPLIT.split(no_proxy.strip()) if e]
    if "*" in entries:
        return True
    return any(_entry_matches(entry, host, port, address) for entry in entries)


def forward_proxy_for(upstream: URL, environ: Mapping[str, str]) -> ForwardProxy | None:
    """The forward proxy for `upstream` under `environ`, or None to connect directly.
    Raises ValueError (naming the variable, never its credentials) for a proxy URL that cannot work."""
    found = _lookup(environ, "https_proxy" if upstream.scheme == "https" else "http_proxy")
    if found is None:
        return None
    no_proxy = _lookup(environ, "no_proxy")
    port = upstream.port or (443 if upstream.scheme == "https" else 80)
    if bypassed(upstream.raw_host or "", port, no_proxy[1] if no_proxy else ""):
        return None
    return _parse(*found)
