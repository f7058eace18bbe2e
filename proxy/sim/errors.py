"""Errors the simulator answers with, each carrying its HTTP status and both providers' names.

SimError                      (status, OpenAI type + code, Anthropic type)
├── 400 invalid_request_error  bad JSON, missing field, context_length_exceeded
├── 401 invalid_api_key        / authentication_error
├── 404 model_not_found        / not_found_error
├── 429 rate_limit_exceeded    / rate_limit_error   (injected, or a key over its budget)
├── 500 server_error           / api_error
└── 503 overloaded             / overloaded_error (Anthropic sends 529)
"""

from __future__ import annotations

from typing import Any

__all__ = ["SimError", "bad_request", "error_body", "injected", "model_not_found", "over_budget", "unauthorized"]


class SimError(Exception):
    """An error response: HTTP status, message, OpenAI `type`/`code`, Anthropic `type`."""

    def __init__(
        self,
        status: int,
        message: str,
        openai_type: str,
        code: str | None,
        anthropic_type: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers  # sent with the error (rate-limit headers, retry-after)
        self.status = status
        self.message = message
        self.openai_type = openai_type
        self.code = code
        self.anthropic_type = anthropic_type

    def status_for(self, api: str) -> int:
        if api == "messages" and self.anthropic_type == "overloaded_error":
            return 529
        return self.status


def bad_request(message: str, code: str | None = None) -> SimError:
    return SimError(400, message, "invalid_request_error", code, "invalid_request_error")


def unauthorized() -> SimError:
    return SimError(
        401,
        "Incorrect API key provided. You can find your API key in your account settings.",
        "invalid_request_error",
        "invalid_api_key",
        "authentication_error",
    )


def model_not_found(model: str) -> SimError:
    return SimError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
        "not_found_error",
    )


def over_budget(kind: str, headers: dict[str, str]) -> SimError:
    """429 for a key that spent its rate-limit budget; `headers` say how long to wait."""
    message = (
        f"Rate limit reached for {kind} (simulated budget). Please try again in {headers.get('retry-after', '1')}s."
    )
    return SimError(429, message, kind, "rate_limit_exceeded", "rate_limit_error", headers)


_INJECTED: dict[str, tuple[int, str, str, str, str]] = {
    "429": (429, "Rate limit reached for requests (simulated).", "requests", "rate_limit_exceeded", "rate_limit_error"),
    "500": (
        500,
        "The server had an error while processing your request (simulated).",
        "server_error",
        "server_error",
        "api_error",
    ),
    "503": (503, "The engine is currently overloaded (simulated).", "server_error", "overloaded", "overloaded_error"),
    "midstream": (
        500,
        "The server had an error while generating (simulated).",
        "server_error",
        "server_error",
        "overloaded_error",
    ),
}


def injected(case: str) -> SimError:
    """The error a failure trigger asks for (`429`, `500`, `503`, `midstream`)."""
    status, message, openai_type, code, anthropic_type = _INJECTED[case]
    return SimError(status, message, openai_type, code, anthropic_type)


def error_body(api: str, error: SimError) -> dict[str, Any]:
    """The JSON error body each provider sends."""
    if api == "messages":
        return {"type": "error", "error": {"type": error.anthropic_type, "message": error.message}}
    return {"error": {"message": error.message, "type": error.openai_type, "param": None, "code": error.code}}
