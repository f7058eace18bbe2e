"""One connection's response cycle, without I/O: reads, closes and timeouts in; a `State` and the
events the adapter must act on out.

Every rule about what a connection may do next lives in this file: the table `TRANSITIONS` (with
`OTHERWISE` for any input a state does not list) and the one function that applies it,
`transition()`. `ResponseCycle` turns what llhttp (`httptools`) parses into inputs, and keeps
what a state does not: the head, the framing, why a response failed. The asyncio side
(`_connection.py`) feeds it and does what its events say; it decides nothing itself.

    IDLE ─SEND─► AWAIT_HEAD ─HEAD─────────► BODY ────END──────────► DONE ─RELEASE─► IDLE
                  │ ▲    │                     └─END_CLOSE──┐          │ EOF, any read, garbage,
                  └─┘    └─HEAD_TO_EOF─► BODY_TO_EOF ─EOF───┴─► MUST_CLOSE ◄┘ a failed relay
                INTERIM (1xx)      (ends on END / END_CLOSE too: 204, 304)

    AWAIT_HEAD, BODY, BODY_TO_EOF ─INVALID, TIMEOUT, SINK_FAILED, EOF (not BODY_TO_EOF)─► FAILED
    IDLE ─bytes nobody asked for, EOF─► CLOSED     AWAIT_HEAD, BODY, BODY_TO_EOF ─RELEASE─► CLOSED

A response is *complete* in DONE and MUST_CLOSE; only DONE may go back to the pool. A response
to HEAD ends with its head (RFC 9110 §9.3.2), so it is never reused: llhttp would read the body
its `Content-Length` announces.
"""

from __future__ import annotations

import enum

import httptools

from proxy.errors import BodyFailure, UpstreamBroken, UpstreamTimeout

__all__ = [
    "FIELD_LIMIT",
    "HEAD_LIMIT",
    "OTHERWISE",
    "TRANSITIONS",
    "Event",
    "Input",
    "ResponseCycle",
    "Stale",
    "State",
    "transition",
]

HEAD_LIMIT = 64 * 1024  # response status line + headers; more is a broken upstream
FIELD_LIMIT = 16 * 1024  # one header line


class State(enum.Enum):
    """Where a connection is in its response cycle."""

    IDLE = "idle"  # no request: new, or back in the pool
    AWAIT_HEAD = "await_head"  # the request is written; interim (1xx) heads are skipped
    BODY = "body"  # the final head is in; the body is framed (Content-Length or chunked)
    BODY_TO_EOF = "body_to_eof"  # ... unframed: it ends with the connection (RFC 9112 §6.3)
    DONE = "done"  # the response is whole and the connection may carry another request
    MUST_CLOSE = "must_close"  # the response is whole, the connection may not be reused
    FAILED = "failed"  # the response failed (`ResponseCycle.failure` says how); connection closed
    CLOSED = "closed"  # the connection closed with no response in flight

    __hash__ = object.__hash__  # see `Event`


class Input(enum.Enum):
    """What happened: on the wire, in the relay, or by the caller's hand."""

    SEND = "send"  # the request was written
    INTERIM = "interim"  # a 1xx head (not 101): the real one follows
    HEAD = "head"  # the final head, of a framed body
    HEAD_TO_EOF = "head_to_eof"  # the final head, of a body that runs to the end of the connection
    END = "end"  # the parser reached the end of a message, and the upstream keeps the connection
    END_CLOSE = "end_close"  # ... and the upstream will not (HTTP/1.0, `Connection: close`), or HEAD
    STRAY = "stray"  # bytes no request asked for: on an idle connection, or after the response
    INVALID = "invalid"  # bytes that are not HTTP, or over our limits
    SINK_FAILED = "sink_failed"  # the relay could not take the body (client gone, discard budget spent)
    TIMEOUT = "timeout"  # nothing arrived within the idle read timeout
    EOF = "eof"  # the connection closed
    RELEASE = "release"  # the caller is done with the response

    __hash__ = object.__hash__  # see `Event`


class Event(enum.Enum):
    """What the adapter must do after a transition."""

    HEAD_READY = "head_ready"  # the final head is in: status, reason and headers can be read
    BODY_ENDED = "body_ended"  # the body is whole: wake the relay
    FAIL = "fail"  # the response failed: close the connection, raise `failure` to whoever waits
    CLOSE = "close"  # close the connection; nobody waits on it

    # Members are singletons compared by identity: hash them so, in C (Enum's own `__hash__`
    # is Python code, run on every table lookup).
    __hash__ = object.__hash__


# The members as module names, in definition order (a test pins it): for the table's sake, and
# because `State.BODY` is an attribute lookup through the enum's metaclass, dearer than a
# global's, on a path run per read (docs/performance.md).
IDLE, AWAIT_HEAD, BODY, BODY_TO_EOF, DONE, MUST_CLOSE, FAILED, CLOSED = State
SEND, INTERIM, HEAD, HEAD_TO_EOF, END, END_CLOSE, STRAY, INVALID, SINK_FAILED, TIMEOUT, EOF, RELEASE = Input
HEAD_READY, BODY_ENDED, FAIL, CLOSE = Event

# (state, input) -> (next state, event). An input a state does not list goes by `OTHERWISE`.
TRANSITIONS: dict[State, dict[Input, tuple[State, Event | None]]] = {
    IDLE: {
        SEND: (AWAIT_HEAD, None),
        EOF: (CLOSED, None),
    },
    AWAIT_HEAD: {
        INTERIM: (AWAIT_HEAD, None),
        END: (AWAIT_HEAD, None),  # the end of an interim response
        END_CLOSE: (AWAIT_HEAD, None),
        HEAD: (BODY, HEAD_READY),
        HEAD_TO_EOF: (BODY_TO_EOF, HEAD_READY),
        RELEASE: (CLOSED, None),  # the caller gave up (cancelled); it closes the connection
    },
    BODY: {
        END: (DONE, BODY_ENDED),
        END_CLOSE: (MUST_CLOSE, BODY_ENDED),
        RELEASE: (CLOSED, None),
    },
    BODY_TO_EOF: {
        EOF: (MUST_CLOSE, BODY_ENDED),  # no length given: the close is the end, not a cut
        END: (DONE, BODY_ENDED),  # llhttp ends some unframed bodies itself (204, 304)
        END_CLOSE: (MUST_CLOSE, BODY_ENDED),
        RELEASE: (CLOSED, None),
    },
    DONE: {
        RELEASE: (IDLE, None),
        EOF: (MUST_CLOSE, None),
    },
    MUST_CLOSE: {
        RELEASE: (MUST_CLOSE, None),  # the caller closes it; the response stays complete
        EOF: (MUST_CLOSE, None),
        END: (MUST_CLOSE, None),  # the end llhttp sees of a bodiless answer to HEAD
        END_CLOSE: (MUST_CLOSE, None),
    },
    FAILED: {},
    CLOSED: {},
}

OTHERWISE: dict[State, tuple[State, Event | None]] = {
    IDLE: (CLOSED, CLOSE),  # bytes nobody asked for: the connection cannot be trusted
    AWAIT_HEAD: (FAILED, FAIL),
    BODY: (FAILED, FAIL),
    BODY_TO_EOF: (FAILED, FAIL),
    DONE: (MUST_CLOSE, CLOSE),  # the response was whole; only the connection is spoiled
    MUST_CLOSE: (MUST_CLOSE, CLOSE),
    FAILED: (FAILED, None),  # the first failure is the one reported
    CLOSED: (CLOSED, None),
}


def transition(state: State, what: Input) -> tuple[State, Event | None]:
    """The state after `what` happens in `state`, and the event the adapter must act on."""
    return TRANSITIONS[state].get(what) or OTHERWISE[state]


class Stale(Exception):
    """A reused connection closed before any byte of the response: idempotent requests may retry."""


class _Broken(Exception):
    """Raised inside a parser callback to stop parsing; `what` is our own words for it."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _Stray(Exception):
    """Raised inside a parser callback: bytes after the response's end."""


class ResponseCycle:
    """The response cycle of one upstream connection, one request at a time.

    `start()` when the request is written; `receive(data)` per read returns the body bytes in
    it; `closed()`, `timed_out()`, `sink_failed()`, `release()` for the rest. Each appends the
    events of its transitions to `events`, which the caller drains.
    """

    def __init__(self, where: str) -> None:
        self.where = where  # "host:port", for our own messages
        self.parser = httptools.HttpResponseParser(self)
        self.state = IDLE
        # The response was read to its end (DONE or MUST_CLOSE): kept by `_fire`, since the relay
        # asks after every read whether the body ended in it.
        self.complete = False
        self.events: list[Event] = []
        self.parts: list[bytes] = []  # body pieces of the read being parsed
        self._clear()

    def _clear(self) -> None:
        self.head_only = False  # a HEAD request: the response has no body whatever it says
        self.reused = False  # taken from the pool for this request (a stale one may be retried)
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[str, str]] = []
        # The first Content-Type and Content-Encoding, noted as the head is parsed (each name is
        # lowered there anyway): the relay picks its parser from them without scanning again.
        self.content_type: str | None = None
        self.content_encoding: str | None = None
        self.framed = False  # Content-Length or chunked: EOF before the end is a cut
        self.head_bytes = 0  # bytes read before the final head was parsed
        self.failure: BaseException | None = None  # why the cycle entered FAILED
        self.fault: Exception | None = None  # a parse failure held until `settle()`
        self.discard_left: int | None = None  # the body bytes `discard()` still allows

    # --- properties of the state -----------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A request owns the connection (until it is released)."""
        return self.state is not IDLE and self.state is not CLOSED

    @property
    def waiting(self) -> bool:
        """Bytes are due from the upstream: the idle read timeout runs."""
        state = self.state
        return state is AWAIT_HEAD or state is BODY or state is BODY_TO_EOF

    # --- inputs ------------------------------------------------------------------------------

    def _fire(self, what: Input, detail: str = "") -> None:
        state, event = transition(self.state, what)
        if state is FAILED and self.state is not FAILED:
            self.failure = self._failure(what, detail)
        self.state = state
        self.complete = state is DONE or state is MUST_CLOSE
        if event is not None:
            self.events.append(event)

    def _failure(self, what: Input, detail: str) -> BaseException:
        """What failing on `what` in the current state means to whoever waits on the response."""
        if self.state is AWAIT_HEAD:
            if what is TIMEOUT:
                return UpstreamTimeout(f"upstream {self.where} sent no response headers within the idle read timeout")
            if what is EOF:
                if self.reused and not self.head_bytes:
                    return Stale()
                return UpstreamBroken("closed the connection before responding")
            return UpstreamBroken(detail or "sent an invalid HTTP response")  # the pool adds "upstream host:port"
        if what is TIMEOUT:
            return BodyFailure("timeout", detail)
        if what is EOF:
            return BodyFailure("stream_cut", "upstream closed the connection mid-body")
        if what is SINK_FAILED:
            return BodyFailure("client_abort", "the body could not be relayed to the client")
        return BodyFailure("stream_cut", detail or "invalid response body framing")

    def start(self, *, head_only: bool, reused: bool) -> None:
        """The request was written."""
        if self.state is not IDLE:
            raise RuntimeError(f"a request was started on a connection in state {self.state.name}")
        self.head_only = head_only
        self.reused = reused
        self._fire(SEND)

    def receive(self, data: bytes) -> bytes | None:
        """Parse one read; returns the body bytes in it (None: none, or discarded).

        A parse failure found after body bytes is held in `fault`: the caller relays the body
        first, then calls `settle()` (or `sink_failed()` if the relay failed, which wins)."""
        state = self.state
        if state is not BODY and state is not BODY_TO_EOF:
            if state is not AWAIT_HEAD:
                self._fire(STRAY)
                return None
            self.head_bytes += len(data)
        fault: Exception | None = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            fault = exc
        if fault is None and self.state is AWAIT_HEAD and self.head_bytes > HEAD_LIMIT:
            fault = _Broken(f"sent a response head over {HEAD_LIMIT} bytes")
        parts = self.parts
        if not parts:
            if fault is not None:
                self._fail_parse(fault)
            return None
        chunk = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        self.fault = fault
        left = self.discard_left
        if left is not None:
            self.discard_left = left = left - len(chunk)
            if left < 0:
                self.sink_failed()
            return None
        return chunk

    def settle(self) -> None:
        """Act on the parse failure `receive` held back, now that the body before it is relayed."""
        fault, self.fault = self.fault, None
        if fault is not None:
            self._fail_parse(fault)

    def _fail_parse(self, exc: Exception) -> None:
        cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
        if isinstance(cause, _Stray):
            self._fire(STRAY)
        elif isinstance(cause, _Broken):
            self._fire(INVALID, cause.what)  # our own words for a limit or a rule
        elif self.state is AWAIT_HEAD:
            self._fire(INVALID, "sent an invalid HTTP response")  # never the bytes themselves
        else:
            self._fire(INVALID, f"invalid response body framing ({type(exc).__name__})")

    def sink_failed(self) -> None:
        """The relay could not take the body; this, not a parse failure of the same read, ends it."""
        self.fault = None
        self._fire(SINK_FAILED)

    def discard(self, budget: int) -> None:
        """From now on the body is counted and dropped, not returned; past `budget` bytes the
        relay has failed (`SINK_FAILED`), so the connection is not kept."""
        self.discard_left = budget
        if budget < 0:
            self.sink_failed()

    def timed_out(self, seconds: float) -> None:
        """Nothing arrived for `seconds` while bytes were due."""
        self._fire(TIMEOUT, f"upstream sent nothing for {seconds:g}s mid-body")

    def closed(self) -> None:
        """The connection closed (either side)."""
        self._fire(EOF)

    def release(self) -> bool:
        """The caller is done with the response. True: the connection may carry another request;
        False: the caller closes it."""
        self._fire(RELEASE)
        if self.state is not IDLE:
            return False
        self._clear()
        return True

    # --- httptools callbacks (inside `receive`) -----------------------------------------------

    def on_message_begin(self) -> None:
        if self.state is not AWAIT_HEAD:
            raise _Stray  # a second response to one request: stop parsing it

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.state is not AWAIT_HEAD:
            return  # chunked trailers: not relayed (the client's framing is the proxy's own)
        if len(name) + len(value) > FIELD_LIMIT:
            raise _Broken(f"sent a header line over {FIELD_LIMIT} bytes")
        key = name.decode("ascii", "surrogateescape")
        lower = key.lower()
        text = value.decode("utf-8", "surrogateescape")
        if lower == "content-length" or (lower == "transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True
        elif lower == "content-type":
            if self.content_type is None:
                self.content_type = text
        elif lower == "content-encoding" and self.content_encoding is None:
            self.content_encoding = text
        self.headers.append((key, text))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                raise _Broken("switched protocols, which the proxy does not relay")
            self.reason, self.headers, self.framed = b"", [], False
            self.content_type = self.content_encoding = None
            self._fire(INTERIM)
            return
        self.status = status
        self._fire(HEAD if self.framed else HEAD_TO_EOF)
        if self.head_only:
            self._fire(END_CLOSE)

    def on_body(self, body: bytes) -> None:
        if self.state is MUST_CLOSE:
            raise _Stray  # the answer to HEAD ended with its head; llhttp reads the body it announced
        self.parts.append(body)

    def on_message_complete(self) -> None:
        self._fire(END if self.parser.should_keep_alive() else END_CLOSE)
