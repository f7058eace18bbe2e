"""A streaming measurement client: the seed article's script, done right.

It sends one streaming request in any dialect and times it from just before the request is
sent: first byte, first *token* (role-only, empty and usage-only chunks are not tokens — the
article's `KeyError: 'choices'` trap), last token, end of stream. Output tokens come from the
reported usage when there is one, else from the count of token events. Parsing reuses the
proxy's own sans-IO SSE decoder, dialect readers and phase clock, so client and proxy agree on
what a token is, which tokens are a reasoning model's thinking, and how its phases are timed.

    TTFT   = t_first − t0
    TPOT   = (t_last − t_first) / (output_tokens − 1)      (vLLM: the first token excluded)
    tok/s  = output_tokens / (t_end − t_first)             (the decode rate the user sees)

A reasoning model's answer begins after its thinking: its first answer token (`answer_ttft_s`),
the streamed thinking before it (`thinking_s`), or, for reasoning it only reports, the estimate
(`thinking_estimated_s`), as docs/timing.md defines them (`proxy.exchange.timing`).

At the first token it also reads the kernel's `TCP_INFO` of the connection that carried the
request (Linux), and with a `ConnectTimer` on the session, the time spent opening that
connection: together, the network's share of the TTFT (`network_share`). Through a forward
proxy (a `ToolRoute` from `proxy.tools.route`) both are to the forward proxy, and the line says so.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from proxy.dialects import (
    API_CHAT,
    API_COMPLETIONS,
    API_MESSAGES,
    API_RESPONSES,
    reader_for,
)
from proxy.dialects.sse import SSEDecoder, SSEEvent
from proxy.exchange.timing import PhaseClock, RequestTiming
from proxy.tools.route import DIRECT, ToolRoute, os_reason
from proxy.upstream import tcpinfo

__all__ = [
    "API_ALIASES", "Call", "ConnectTimer", "Measurement", "api_name", "auth_headers", "error_message", "measure",
    "ms", "network_share", "request_for", "tls_context",
]  # fmt: skip

API_ALIASES: dict[str, str] = {
    "chat": API_CHAT,
    "chat_completions": API_CHAT,
    "completions": API_COMPLETIONS,
    "responses": API_RESPONSES,
    "messages": API_MESSAGES,
}
_PATHS = {
    API_CHAT: "/chat/completions",
    API_COMPLETIONS: "/completions",
    API_RESPONSES: "/responses",
    API_MESSAGES: "/messages",
}
ANTHROPIC_VERSION = "2023-06-01"
ERROR_TEXT_LIMIT = 300


def api_name(alias: str) -> str:
    """`chat` -> `chat_completions`; the dialect names of the contract pass through."""
    try:
        return API_ALIASES[alias]
    except KeyError:
        raise ValueError(f"unknown api {alias!r}: use one of chat, completions, responses, messages") from None


@dataclass(frozen=True, slots=True)
class Call:
    """One streaming request to make: dialect, model, prompt, output cap, extra body fields."""

    api: str
    model: str
    prompt: str
    max_tokens: int  # as `max_tokens` (`max_output_tokens`), unless `params` gives `max_completion_tokens`
    params: Mapping[str, Any] = field(default_factory=dict)
    # The turns to send instead of `prompt` as one user turn (chat, messages; responses' `input`);
    # a system text goes in `params` the dialect's way (`system`, `instructions`).
    messages: Sequence[Mapping[str, Any]] = ()


def request_for(call: Call) -> tuple[str, dict[str, Any]]:
    """The path (relative to the base URL) and JSON body of a call, streaming with usage."""
    body: dict[str, Any] = {k: v for k, v in call.params.items() if k not in ("stream", "stream_options", "model")}
    body["model"] = call.model
    body["stream"] = True
    turns = list(call.messages) or [{"role": "user", "content": call.prompt}]
    if call.api == API_CHAT:
        body["messages"] = turns
        if "max_completion_tokens" not in body:  # the o-series refuse `max_tokens`
            body.setdefault("max_tokens", call.max_tokens)
        body["stream_options"] = {"include_usage": True}
    elif call.api == API_COMPLETIONS:
        body["prompt"] = call.prompt
        body.setdefault("max_tokens", call.max_tokens)
        body["stream_options"] = {"include_usage": True}
    elif call.api == API_RESPONSES:
        body["input"] = turns if call.messages else call.prompt
        body.pop("max_tokens", None)
        body.setdefault("max_output_tokens", call.max_tokens)
    else:
        body["messages"] = turns
        body.setdefault("max_tokens", call.max_tokens)
    if call.api != API_CHAT:
        body.pop("max_completion_tokens", None)
    return _PATHS[call.api], body


def auth_headers(api: str, api_key: str | None) -> dict[str, str]:
    """Bearer for OpenAI dialects; `x-api-key` + `anthropic-version` for messages."""
    headers = {"anthropic-version": ANTHROPIC_VERSION} if api == API_MESSAGES else {}
    if api_key:
        if api == API_MESSAGES:
            headers["x-api-key"] = api_key
        else:
            headers["Authorization"] = f"Bearer {api_key}"
    return headers


def error_message(body: bytes) -> str:
    """The provider's error message from a JSON error body (or the start of the raw text)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:ERROR_TEXT_LIMIT].decode("utf-8", "replace").strip()
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            kind = err.get("code") or err.get("type")
            return f"{err['message']}" + (f" ({kind})" if isinstance(kind, str) else "")
        if isinstance(err, str):
            return err
    return body[:ERROR_TEXT_LIMIT].decode("utf-8", "replace").strip()


@dataclass(frozen=True, slots=True)
class Measurement:
    """One streamed call as the client saw it; seconds from just before the request was sent."""

    api: str
    model: str
    status: int
    ttfb_s: float | None
    ttft_s: float | None
    total_s: float
    output_tokens: int
    usage_source: str  # reported | counted
    tpot_s: float | None
    tokens_per_s: float | None
    token_events: int
    events: int  # SSE events received
    unparsed: int  # events that were neither JSON nor `[DONE]`
    ended: bool  # the dialect's defined end arrived (a finish reason, `response.completed`…: StreamReader.complete)
    usage_reported: bool
    input_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    response_id: str | None = None
    error: str | None = None
    rtt_s: float | None = None  # one round trip on this connection at the first token (TCP min_rtt; Linux)
    connect_s: float | None = None  # opening a connection for this call (DNS, TCP, TLS); 0 if reused
    # A reasoning model's (docs/timing.md): the answer's first token; the streamed thinking before
    # it; hidden reasoning's estimate (within the TTFT, which holds it); each pace in tokens/s
    answer_ttft_s: float | None = None
    thinking_s: float | None = None
    thinking_estimated_s: float | None = None
    reasoning_tokens_per_s: float | None = None
    answer_tokens_per_s: float | None = None

    @property
    def network_s(self) -> float | None:
        """The network's share of the TTFT: opening the connection (when timed) plus one round trip."""
        if self.rtt_s is None:
            return None
        return (self.connect_s or 0.0) + self.rtt_s

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    def summary(self) -> dict[str, Any]:
        """The fields `probe --json` and the demo print."""
        return {
            "ttft_s": self.ttft_s,
            "total_s": self.total_s,
            "output_tokens": self.output_tokens,
            "tpot_s": self.tpot_s,
            "tokens_per_s": self.tokens_per_s,
        }

    def reasoning(self) -> dict[str, Any]:
        """A reasoning model's numbers, as `probe --json` prints them."""
        return {
            "answer_ttft_s": self.answer_ttft_s,
            "thinking_s": self.thinking_s,
            "thinking_estimated_s": self.thinking_estimated_s,
            "reasoning_tokens": self.reasoning_tokens,
            "reasoning_tokens_per_s": self.reasoning_tokens_per_s,
            "answer_tokens_per_s": self.answer_tokens_per_s,
        }


class _Stream:
    """What the client saw of one response stream, event by event (no I/O here), timed from `t0`
    by the proxy's own phase clock (the request counts as sent at `t0`: the client's wait for its
    first token is all "prefill_wait")."""

    def __init__(self, api: str, t0: float) -> None:
        reader = reader_for(api)
        assert reader is not None
        self.api = api
        self.reader = reader
        self.decoder = SSEDecoder()
        self.phase = PhaseClock(t0)
        self.phase.sent(t0)
        self.events = self.unparsed = 0
        self.error: str | None = None  # the first error event inside the stream

    @property
    def t_first(self) -> float | None:
        return self.phase.t_first

    def feed(self, chunk: bytes, t: float) -> None:
        """One read of the body, arrived at `t`."""
        if self.phase.t_first_byte is None:
            self.phase.body_bytes(t)
        for event in self.decoder.feed(chunk):
            self._event(event, t)

    @property
    def ended(self) -> bool:
        """The dialect's defined end arrived (`StreamReader.complete`): for chat a finish reason,
        with or without `data: [DONE]`."""
        return self.reader.complete

    def _event(self, event: SSEEvent, t: float) -> None:
        self.events += 1
        if event.data[:1] not in (b"{", b"[") and event.data != b"[DONE]":
            self.unparsed += 1
            return
        kind = self.reader.feed(event)
        if kind:
            self.phase.token(t, kind)
        if self.reader.error_type and self.error is None:
            self.error = f"error in stream: {error_message(event.data)}"


class ConnectTimer:
    """Seconds a session spends opening connections (DNS, TCP, TLS), from aiohttp's tracing.

    `aiohttp.ClientSession(trace_configs=[timer.config])`; `measure(..., connect_timer=timer)`.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.total = 0.0
        self._clock = clock
        self.config = aiohttp.TraceConfig()
        self.config.on_connection_create_start.append(self._start)
        self.config.on_connection_create_end.append(self._end)

    async def _start(self, _session: object, ctx: Any, _params: object) -> None:
        ctx.connect_t0 = self._clock()

    async def _end(self, _session: object, ctx: Any, _params: object) -> None:
        self.total += self._clock() - ctx.connect_t0


def _socket_of(response: aiohttp.ClientResponse) -> Any:
    """The TCP socket under the connection that carries `response` (under TLS too)."""
    conn = response.connection
    transport = conn.transport if conn is not None else None
    return transport.get_extra_info("socket") if transport is not None else None


def ms(seconds: float) -> str:
    """Milliseconds to read: `12.3 ms`, and µs resolution below 1 ms (loopback: `0.014 ms`)."""
    value = seconds * 1000
    return f"{value:.1f} ms" if value >= 1 else f"{value:.3f} ms"


def tls_context() -> ssl.SSLContext:
    """The system's trust as it is now (`SSL_CERT_FILE` / `SSL_CERT_DIR` read at this call;
    aiohttp's default context is made once, at import), HTTP/1.1 by ALPN as aiohttp's."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context


def network_share(m: Measurement, route: ToolRoute = DIRECT) -> str | None:
    """The one line: "your network adds X ms of the Y ms TTFT (...)"; None without TCP_INFO.
    Through a forward proxy the connection and its round trip are to the proxy: "at least"."""
    network = m.network_s
    if network is None or m.ttft_s is None or m.rtt_s is None:
        return None
    if route.forward is None:
        parts = f"{ms(m.rtt_s)} round trip"
        if m.connect_s:
            parts = f"{ms(m.connect_s)} opening the connection + {parts}"
        return f"your network adds {ms(network)} of the {ms(m.ttft_s)} TTFT ({parts}; the rest is the server)"
    parts = f"{ms(m.rtt_s)} round trip to the forward proxy"
    if m.connect_s:
        parts = f"{ms(m.connect_s)} opening the connection ({route.connect_means}) + {parts}"
    return (
        f"your network adds at least {ms(network)} of the {ms(m.ttft_s)} TTFT ({parts}; "
        "the rest is the forward proxy's own leg to the target and the server)"
    )


async def _exchange(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    headers: Mapping[str, str],
    stream: _Stream,
    clock: Callable[[], float],
    route: ToolRoute,
    also: Callable[[bytes, float], None] | None = None,
    t0: float = 0.0,
) -> tuple[int, str | None, tcpinfo.TcpInfo | None]:
    """POST and read the answer into `stream` (and `also`): (status, error, the connection's
    TCP_INFO at the first token). Errors name the kind of failure, never the exception's text (it
    can carry the URL)."""
    status = 0
    tcp: tcpinfo.TcpInfo | None = None
    try:
        async with session.post(url, data=payload, **route.options(headers)) as response:
            status = response.status
            if status == 407 and route.forward is not None:  # only a proxy sends 407 (RFC 9110)
                return status, "; ".join(route.wants_credentials()), None
            if status != 200:
                return status, f"HTTP {status}: {error_message(await response.read())}", None
            sock = _socket_of(response)
            async for chunk in response.content.iter_any():
                t = clock()
                stream.feed(chunk, t)
                if also is not None:
                    also(chunk, t - t0)
                if tcp is None and stream.t_first is not None:
                    tcp = tcpinfo.read(sock)  # once, after the first token's clock: one system call
    except aiohttp.ClientPayloadError:
        return status, "stream cut: the connection closed mid-body", tcp
    except aiohttp.ClientHttpProxyError as exc:  # the forward proxy answered CONNECT without a tunnel
        return status, "; ".join(route.refused(exc.status, exc.message)), tcp
    except aiohttp.ClientProxyConnectionError as exc:
        return status, "; ".join(route.unreachable(os_reason(exc.os_error))), tcp
    except aiohttp.ClientConnectorError as exc:
        return status, f"cannot connect to {exc.host}:{exc.port}: {exc.os_error.strerror or exc.os_error}", tcp
    except aiohttp.ClientError as exc:
        return status, type(exc).__name__, tcp
    except TimeoutError:
        return status, "timed out" + (f" ({route.described})" if route.forward is not None else ""), tcp
    return status, stream.error, tcp


async def measure(
    session: aiohttp.ClientSession,
    base_url: str,
    call: Call,
    *,
    api_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    connect_timer: ConnectTimer | None = None,
    route: ToolRoute = DIRECT,
    also: Callable[[bytes, float], None] | None = None,
) -> Measurement:
    """Send `call` to `base_url` and time its stream. HTTP and stream errors come back in `error`.

    With `connect_timer` (on the session's trace configs) the time spent opening a connection for
    this call is measured too. `route`: directly, or through a forward proxy. `also`: given each
    read of the body as well, with the seconds since the request's start (another client's
    parsing of the same bytes, on the same clock: `proxy.tools.article`)."""
    path, body = request_for(call)
    send_headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
        **auth_headers(call.api, api_key),
        **(headers or {}),
    }
    connecting = connect_timer.total if connect_timer is not None else 0.0
    t0 = clock()
    stream = _Stream(call.api, t0)
    status, error, tcp = await _exchange(
        session, base_url.rstrip("/") + path, orjson.dumps(body), send_headers, stream, clock, route, also, t0
    )
    t_end = clock()
    if status == 200 and error is None and not stream.ended:
        error = "the stream ended without its end" if stream.events else "an empty event stream"
    connect = connect_timer.total - connecting if connect_timer is not None else None
    return _measurement(call, status, error, stream, t0, t_end, tcp, connect)


def _measurement(
    call: Call,
    status: int,
    error: str | None,
    s: _Stream,
    t0: float,
    t_end: float,
    tcp: tcpinfo.TcpInfo | None = None,
    connect_s: float | None = None,
) -> Measurement:
    usage = s.reader.usage
    reported = usage is not None and usage.output_tokens is not None
    output_tokens = usage.output_tokens if usage is not None and usage.output_tokens is not None else s.phase.tokens
    t: RequestTiming = s.phase.finish(t_end, output_tokens, reasoning_tokens=usage.reasoning_tokens if usage else None)
    tpot = None
    if t.first_token is not None and t.last_token is not None and output_tokens > 1:
        tpot = (t.last_token - t.first_token) / (output_tokens - 1)
    decode_time = t_end - t.first_token if t.first_token is not None else None
    reasoning_pace = (
        t.thinking_total / t.reasoning_token_events if t.reasoning_token_events and t.thinking_total else None
    )
    return Measurement(
        api=call.api,
        model=call.model,
        status=status,
        ttfb_s=t.ttfb,
        ttft_s=t.ttft,
        total_s=t_end - t0,
        output_tokens=output_tokens,
        usage_source="reported" if reported else "counted",
        tpot_s=tpot,
        tokens_per_s=output_tokens / decode_time if decode_time else None,
        token_events=t.token_events,
        events=s.events,
        unparsed=s.unparsed,
        ended=s.ended,
        usage_reported=reported,
        input_tokens=usage.input_tokens if usage else None,
        cached_tokens=usage.cached_input_tokens if usage else None,
        reasoning_tokens=usage.reasoning_tokens if usage else None,
        response_id=s.reader.response_id,
        error=error,
        rtt_s=tcp.round_trip if tcp is not None else None,
        connect_s=connect_s,
        answer_ttft_s=t.time_to_first_answer_token,
        thinking_s=t.thinking,
        thinking_estimated_s=t.thinking_estimated,
        reasoning_tokens_per_s=1 / reasoning_pace if reasoning_pace else None,
        answer_tokens_per_s=1 / t.answer_tpot if t.answer_tpot else None,
    )
