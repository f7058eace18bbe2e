"""A request's outcome, decided once, from what its handler saw. Pure: facts in, `Outcome` out.

The handler only notes facts as they happen (how the exchange ended, the status the client got);
`decide` names the outcome from them with these rules, first match wins (docs/errors.md has the
words; the vocabulary is `proxy.errors.ErrorType`):

    the proxy answered itself (refused)                 its own status and word
    the proxy's own code failed (internal)              internal_error
    it ended early, but the client had the whole answer  clean (below), timed to the last byte
    the client left, or the drain cut it, after the      stream_error, timed to the last byte
      stream reported its own error
    it ended early otherwise                            stream_cut | timeout | client_abort | shutdown
    complete                                            clean

    clean: the status's word (`error_type_for_status`), else stream_error if the stream
           reported its own error, else stream_incomplete if a parsed stream ended without its
           dialect's defined end (an empty event stream included), else "" (success)

"Whole answer": the stream's terminal event, or the whole body, was written to the client; many
clients close right after it, and an upstream cutting the connection then has lost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.errors import ErrorType, error_type_for_status

__all__ = ["End", "Facts", "Outcome", "decide"]

# How the exchange ended: relayed to its end, the client left, the drain deadline cut it, the
# proxy's own code failed, or the upstream stopped mid-body (closed, or went silent).
End = Literal["complete", "client_left", "drained", "internal", "stream_cut", "timeout"]

_EARLY: dict[End, ErrorType] = {
    "client_left": "client_abort",
    "drained": "shutdown",
    "stream_cut": "stream_cut",
    "timeout": "timeout",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """What one request's handler saw; nothing here is a judgement."""

    status: int  # what the client got: the upstream's status, or the proxy's own answer's
    refused: ErrorType | None = None  # the proxy answered itself, with this word
    end: End = "complete"
    whole: bool = False  # the client had the whole answer when it ended
    stream_error: bool = False  # the stream reported its own error (an error chunk or event)
    error_head: bytes = b""  # the first bytes of an error response's body (a 404 naming the model)
    unfinished: bool = False  # a parsed stream without its dialect's defined end (a finish reason, ...)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request came to: the status the client got, its `error_type` ("" for success),
    and whether it is timed to its last byte written rather than to when its handler finished."""

    status: int
    error_type: ErrorType | Literal[""]
    at_last_byte: bool = False


def decide(facts: Facts) -> Outcome:
    """The outcome of one request, by the rules in the module's docstring."""
    status = facts.status
    if facts.refused is not None:
        return Outcome(status, facts.refused)
    end = facts.end
    if end == "complete":
        return _clean(facts, at_last_byte=False)
    if end == "internal":
        return Outcome(status, "internal_error")
    if facts.whole:
        return _clean(facts, at_last_byte=True)
    if facts.stream_error and (end == "client_left" or end == "drained"):
        # The client (e.g. the OpenAI SDK, which raises on an error chunk) left on the stream's
        # own error: the upstream failed the request, the client did not.
        return Outcome(status, "stream_error", at_last_byte=True)
    return Outcome(status, _EARLY[end])


def _clean(facts: Facts, *, at_last_byte: bool) -> Outcome:
    error = error_type_for_status(facts.status, facts.error_head)
    if not error and facts.stream_error:
        error = "stream_error"
    elif not error and facts.unfinished:
        error = "stream_incomplete"
    return Outcome(facts.status, error, at_last_byte)
