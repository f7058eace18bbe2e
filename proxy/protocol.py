"""aiohttp's HTTP server, with taotrace's own answers to requests the parser refuses.

aiohttp answers a request it cannot parse (ambiguous framing, NUL/CR in a header value, obs-fold,
a header or target over the size limit) with the parser's message as the response body, and
logs it at ERROR with the exception. Both quote the offending line, and that line can be an
`Authorization` header or a `?key=` query. Here the answer is a fixed JSON error naming only
what was wrong, and the log line (DEBUG: anyone can send garbage) names only that too.
"""

from __future__ import annotations

import logging
import re
import traceback
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from proxy.errors import HeadersTooLarge, MalformedRequest, ProxyError

__all__ = ["GuardedAppRunner", "refusal_for"]

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


class GuardedAppRunner(web.AppRunner):
    """`web.AppRunner` whose connections answer parse errors with `refusal_for`."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        kwargs: dict[str, Any] = dict(server._kwargs)
        return _GuardedServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            **kwargs,
        )
