"""How failures map to HTTP statuses, `error_type` words and the proxy's own error bodies.

    ProxyError                 the proxy answers itself (status + error_type)
    ├── UpstreamUnreachable    502 connect        refused, DNS, TLS
    ├── UpstreamTimeout        504 timeout        connect timeout, silent upstream
    ├── UpstreamBroken         502 upstream_error reset or invalid HTTP before the headers
    ├── BodyTooLarge           413 request_too_large
    ├── HeadersTooLarge        431 request_too_large  a header line or the target over the limit
    ├── MalformedRequest       400 bad_request    framing or header syntax the parser refused
    └── BadTarget              400 bad_request    a request target the proxy will not forward

    BodyFailure                after the response head: the body could not be relayed to its end,
                               so the client's connection is cut (error_type: stream_cut, timeout,
                               client_abort); no status, the client already has one

Messages are written here, never copied from exceptions: those can carry URLs with query
strings and, in `repr()`, request headers.

`ErrorType` is the whole `error_type` vocabulary (metric label, span `error.type`); "" means
success. docs/errors.md documents each word (a test compares its table with `ERROR_TYPES`).
"""

from __future__ import annotations

from typing import ClassVar, Final, Literal, get_args

import orjson
from aiohttp import web

__all__ = [
    "ERROR_TYPES",
    "BadTarget",
    "BodyFailure",
    "BodyTooLarge",
    "ErrorType",
    "HeadersTooLarge",
    "MalformedRequest",
    "ProxyError",
    "UpstreamBroken",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "error_type_for_status",
]

ErrorType = Literal[
    "auth",  # upstream 401/403
    "bad_request",  # upstream 400/422 and other 4xx; a target the proxy will not forward
    "not_found",  # upstream 404 that is not about a model
    "model_not_found",  # upstream 404 naming the model
    "rate_limited",  # upstream 429
    "request_too_large",  # 413 (the proxy's body limit or the upstream's)
    "upstream_error",  # upstream 5xx, or a response that is not valid HTTP
    "connect",  # could not connect upstream (refused, DNS, TLS): 502
    "timeout",  # connect timeout, or the upstream went silent past the idle timeout: 504
    "stream_cut",  # the upstream closed the connection mid-body
    "stream_error",  # an error event inside a 200 stream
    "stream_incomplete",  # a stream whose body ended cleanly without its dialect's end (no finish reason)
    "client_abort",  # the client went away before the end
    "shutdown",  # still running when the drain deadline passed
    "internal_error",  # a failure of the proxy's own code while relaying (logged with its traceback)
    "worker_lost",  # --workers: the worker process serving it died (counted by the supervisor)
]
ERROR_TYPES: Final[tuple[ErrorType, ...]] = get_args(ErrorType)


class ProxyError(Exception):
    """A request the proxy answers itself."""

    status: ClassVar[int] = 502
    error_type: ClassVar[ErrorType] = "upstream_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def response(self) -> web.Response:
        """An OpenAI-shaped error body, so SDKs surface the message."""
        body = {"error": {"message": f"taotrace: {self.message}", "type": self.error_type, "code": self.error_type}}
        return web.Response(status=self.status, body=orjson.dumps(body), content_type="application/json")


class UpstreamUnreachable(ProxyError):
    status = 502
    error_type = "connect"


class UpstreamTimeout(ProxyError):
    status = 504
    error_type = "timeout"


class UpstreamBroken(ProxyError):
    status = 502
    error_type = "upstream_error"


class BodyTooLarge(ProxyError):
    status = 413
    error_type = "request_too_large"


class BadTarget(ProxyError):
    status = 400
    error_type = "bad_request"


class HeadersTooLarge(ProxyError):
    status = 431
    error_type = "request_too_large"


class MalformedRequest(ProxyError):
    status = 400
    error_type = "bad_request"


class BodyFailure(Exception):
    """The response body could not be read or relayed to its end; `error_type` is the metrics label."""

    def __init__(self, error_type: ErrorType, message: str) -> None:
        super().__init__(message)
        self.error_type: ErrorType = error_type


def error_type_for_status(status: int, body_head: bytes = b"") -> ErrorType | Literal[""]:
    """The `error_type` of an upstream answer; "" for success. `body_head`: its first bytes."""
    if status < 400:
        return ""
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "model_not_found" if b"model" in body_head.lower() else "not_found"
    if status == 429:
        return "rate_limited"
    if status == 413:
        return "request_too_large"
    if status in (408, 504):
        return "timeout"
    if status >= 500:
        return "upstream_error"
    return "bad_request"
