"""aiohttp's HTTP server, with taotrace's own answers to requests the parser refuses.

aiohttp answers a request it cannot parse (ambiguous framing, NUL/CR in a header value, obs-fold,
a header or target over the size limit) with the parser's message as the response body, and
logs it at ERROR with the exception. Both quote the offending line, and that line can be an
`Authorization` header or a `?key=` query. Here the answer is a fixed JSON error naming only
what was wrong, and the log line (DEBUG: anyone can send garbage) names only that too.

aiohttp offers no hook for this, so this module is built on its internals. The release they were
read in is `AIOHTTP_VERIFIED` (pinned in pyproject.toml with `~=`); tests/test_aiohttp_internals.py
fails when the installed aiohttp is another minor release or any name below is gone, so an
upgrade is a deliberate act: re-read these names in the new release, rerun
tests/adversarial/test_smuggling.py, then move the pin.

Private or undocumented aiohttp names used (`AIOHTTP_INTERNALS`), and why:

- `web.AppRunner._make_server`: where a runner builds its `web.Server`; overridden to build ours.
- `web.Server._kwargs` and `._loop`: what `Server.__call__` hands each connection's
  `RequestHandler` (handler_args, the loop); ours hands the same to `_GuardedRequestHandler`.
- `web.Server.request_handler`, `.request_factory`, `.handler_cancellation`: the server built
  by `super()._make_server()`, copied into ours.
- `web.Server.__call__`: the per-connection protocol factory, overridden.
- `web.RequestHandler.handle_error(request, status, exc, message)`: the error answer (its
  signature is relied on), overridden.
- `BaseRequest.writer.output_size`: whether the response has started (then no error answer).
- `http_exceptions.HttpProcessingError.message` and its C parser's `"<what>:\n\n  b'<line>'"`
  layout: only `<what>` is shown; `http_exceptions.LineTooLong`: oversize lines answer 431.
- `web.Server.pre_shutdown` (proxy/server/serving.py's drain): closes idle keep-alive connections.
- `web.StreamResponse._send_headers_immediately`: False in `RelayedResponse`, so `prepare()`
  leaves the serialized head in the writer; the relay sends it with the body bytes that came
  with the upstream's head (`StreamWriter.write`), or alone at once (`send_headers()`).
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from proxy.errors import HeadersTooLarge, MalformedRequest, ProxyError

__all__ = ["AIOHTTP_INTERNALS", "AIOHTTP_VERIFIED", "GuardedAppRunner", "RelayedResponse", "refusal_for"]

# The aiohttp release (major.minor) whose internals the names below were read in.
AIOHTTP_VERIFIED = "3.14"
AIOHTTP_INTERNALS = (
    "web.AppRunner._make_server",
    "web.Server._kwargs",
    "web.Server._loop",
    "web.Server.request_handler",
    "web.Server.request_factory",
    "web.Server.handler_cancellation",
    "web.Server.__call__",
    "web.Server.pre_shutdown",
    "web.RequestHandler.handle_error",
    "web.BaseRequest.writer.output_size",
    "http_exceptions.HttpProcessingError.message",
    "http_exceptions.LineTooLong",
    "web.StreamResponse._send_headers_immediately",
)

log = logging.getLogger("taotrace")

# The C parser's messages read "<what>:\n\n  b'<the offending line>'\n  ^"; only <what> is safe.
_SAFE_REASON = re.compile(r"[A-Za-z][A-Za-z0-9 `',.()/-]{0,79}")


def refusal_for(exc: BaseException | None) -> ProxyError:
    """Our error for a request the HTTP parser refused; never quotes the request itself."""
    if isinstance(exc, LineTooLong):
        return HeadersTooLarge("a request header line or the request target is too long")
    reason = None
    message = getattr(exc, "message", None) if isinstance(exc, HttpProcessingError) else None
    if isinstance(message, str) and ":\n" in message:
        head = message.split(":\n", 1)[0].strip()
        if _SAFE_REASON.fullmatch(head):
            reason = head
    text = (
        f"malformed HTTP request ({reason}); nothing was forwarded"
        if reason
        else "malformed HTTP request; nothing was forwarded"
    )
    return MalformedRequest(text)


class _GuardedRequestHandler(web.RequestHandler):
    """One connection's protocol; only the error answer differs from aiohttp's."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            # A bug of ours: keep the stack for debugging, drop the exception's text (it may quote data).
            stack = "".join(traceback.format_tb(exc.__traceback__)) if exc is not None else ""
            log.error("unhandled %s while handling a request\n%s", type(exc).__name__, stack)
            resp = web.Response(status=500, text="taotrace: internal error in the proxy\n")
        else:
            error = refusal_for(exc)
            log.debug("refused a request from %s: %s (%s)", request.remote, error.message, type(exc).__name__)
            resp = error.response()
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send the error")
        resp.force_close()
        return resp


class _GuardedServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _GuardedRequestHandler(self, loop=self._loop, **self._kwargs)


Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class GuardedAppRunner(web.AppRunner):
    """`web.AppRunner` whose connections answer parse errors with `refusal_for`.

    `direct`: the handler of every request, instead of the application's router (the proxy has
    one catch-all route: resolving it, building its match info and looking for middlewares was
    work on every request before the request could go upstream). The application still owns the
    start-up and clean-up; `direct` must do what the router did that it needs (the proxy's:
    `Expect`)."""

    def __init__(self, app: web.Application, *, direct: Handler | None = None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._direct = direct

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        kwargs: dict[str, Any] = dict(server._kwargs)
        return _GuardedServer(
            self._direct or server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            **kwargs,
        )


class RelayedResponse(web.StreamResponse):
    """A streamed response whose head `prepare()` serializes but does not send: the relay sends
    it with the first body bytes when they came in the same upstream read (one system call, one
    wake-up of the client instead of two), or alone, at once, when they did not."""

    _send_headers_immediately = False
