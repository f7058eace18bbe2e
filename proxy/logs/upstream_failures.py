"""Upstream failures as WARNING lines: which upstream, what went wrong, rate-limited.

A request the upstream failed is otherwise silent at the default level (the client gets its 502
or 504, the metrics count it). Each line names the upstream by its origin (`origin()`: never
userinfo, path or query) and a cause from the fixed vocabulary below, read from the exception's
type and the exceptions it was raised while handling (`__context__`: the `OSError` or
`ssl.SSLError` behind our own error), never from an exception's text: that can carry URLs with
query strings and, in `repr()`, request headers.

    before the response head (ProxyError)     in the body (BodyFailure)
      connection refused                        connection closed mid-response
      connection reset                          invalid body framing
      DNS lookup failed                         no data within the read timeout
      TLS handshake failed
      TLS certificate not trusted
      host unreachable, network unreachable
      connect timeout
      no response headers within the read timeout
      closed the connection before responding
      invalid response
      the forward proxy refused the tunnel, the forward proxy wants credentials
      cannot connect (any other)
"""

from __future__ import annotations

import errno
import socket
import ssl
from collections.abc import Callable, Iterator

from proxy.config.envproxy import ForwardProxy
from proxy.config.routes import Route
from proxy.errors import BodyFailure, ProxyError, UpstreamBroken, UpstreamTimeout, UpstreamUnreachable
from proxy.logs.origin import origin
from proxy.logs.ratelimited import RateLimitedLog

__all__ = ["UpstreamFailures", "body_cause", "head_cause"]

_ERRNO_CAUSES = {errno.EHOSTUNREACH: "host unreachable", errno.ENETUNREACH: "network unreachable"}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or while handling (`raise ... from None` keeps
    `__context__`), a few deep."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def _os_cause(exc: BaseException) -> str | None:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "TLS certificate not trusted"
    if isinstance(exc, ssl.SSLError):
        return "TLS handshake failed"
    if isinstance(exc, socket.gaierror):
        return "DNS lookup failed"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, TimeoutError):  # asyncio.wait_for's, around the connect
        return "connect timeout"
    if isinstance(exc, OSError):
        return _ERRNO_CAUSES.get(exc.errno or 0, "cannot connect")
    return None


def head_cause(error: ProxyError) -> str:
    """Why the upstream gave no response head, in the vocabulary above."""
    for exc in _chain(error):
        found = _os_cause(exc)
        if found is not None:
            return found
    # No OS error behind it: the upstream answered badly, or said nothing. Our own messages
    # (proxy/upstream/) tell the forward proxy's answers and a failed lookup apart.
    message = error.message
    if isinstance(error, UpstreamTimeout):
        return "no response headers within the read timeout"
    if isinstance(error, UpstreamBroken):
        return "closed the connection before responding" if "closed the connection" in message else "invalid response"
    if isinstance(error, UpstreamUnreachable):
        if "resolve" in message:
            return "DNS lookup failed"
        if "tunnel" in message:
            return "the forward proxy refused the tunnel"
        if "credentials" in message:
            return "the forward proxy wants credentials"
    return "cannot connect"


def body_cause(failure: BodyFailure) -> str:
    """Why the response body stopped before its end (not the client leaving)."""
    if failure.error_type == "timeout":
        return "no data within the read timeout"
    if str(failure).startswith("invalid"):
        return "invalid body framing"
    return "connection closed mid-response"


class UpstreamFailures:
    """Reports the upstreams' failures as rate-limited warnings; never raises.

    An upstream is named by its route's origin (`https://api.example.com:443`), with the forward
    proxy it is reached through, if any (`forward_of`, shown without credentials)."""

    def __init__(self, log: RateLimitedLog, forward_of: Callable[[Route], ForwardProxy | None]) -> None:
        self.log = log
        self.forward_of = forward_of
        self._where: dict[str, str] = {}  # route name -> how it is named

    def where(self, route: Route) -> str:
        shown = self._where.get(route.name)
        if shown is None:
            shown = origin(route.url)
            forward = self.forward_of(route)
            if forward is not None:
                shown += f" (through the {forward.where})"
            self._where[route.name] = shown
        return shown

    def before_head(self, route: Route, error: ProxyError) -> None:
        """The proxy answered `error.status` itself: no response head came."""
        try:
            self.log.warning(f"upstream {self.where(route)} failed: {head_cause(error)} (answered {error.status})")
        except Exception:  # reporting must never fail the request
            self.log.logger.debug("could not report an upstream failure", exc_info=True)

    def in_body(self, route: Route, failure: BodyFailure) -> None:
        """The body stopped before its end; the client's connection was cut."""
        try:
            self.log.warning(
                f"upstream {self.where(route)} failed mid-response: {body_cause(failure)} (the response was cut)"
            )
        except Exception:  # reporting must never fail the request
            self.log.logger.debug("could not report an upstream failure", exc_info=True)
