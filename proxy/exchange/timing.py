"""The phase clock: timestamps in, a frozen `RequestTiming` out. Pure: the caller owns the clock.

    t0 ─ network ─ t_sent ─ prefill_wait ─ t_first ─ decode ─ t_last ─ (tail) ─ t_end

TTFT = t_first − t0; TPOT = (t_last − t_first) / (output_tokens − 1) (vLLM: the first token is
excluded); ITL = gaps between consecutive token events; duration = t_end − t0.

A *chunk* (OpenTelemetry GenAI's word) is one streamed item a client SDK would yield: any SSE
event with data except `[DONE]` and `ping` (see `dialects.is_chunk`), token or not. TTFC =
first chunk − t0; the chunk gaps feed `gen_ai.client.operation.time_per_output_chunk`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

__all__ = ["PhaseClock", "RequestTiming"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestTiming:
    """Seconds for each phase of one request; None where the phase did not happen."""

    start: float  # t0 on the monotonic clock
    end: float
    duration: float
    network: float | None
    time_to_headers: float | None
    ttfb: float | None  # first response body byte
    ttft: float | None
    prefill_wait: float | None
    decode: float | None
    tpot: float | None
    itl: tuple[float, ...]  # the gaps between consecutive token events
    token_events: int
    sent: float | None  # t_sent, t_first, t_last on the monotonic clock, for spans
    first_token: float | None
    last_token: float | None
    connection_reused: bool | None
    pool_wait: float | None = None  # waiting for a free pooled connection
    dns: float | None = None
    connect: float | None = None  # TCP connect plus TLS handshake, timed as one step
    ttfc: float | None = None  # first chunk (any streamed item), which may precede the first token
    chunk_gaps: tuple[float, ...] = ()  # between consecutive chunks (the spec's time per output chunk)
    # The proxy's own time: head arrival -> request written upstream, minus pool wait, DNS and connect
    overhead_request: float | None = None
    relay: tuple[float, ...] = ()  # per upstream read: handed to us -> written to the client socket
    time_to_last_byte: float | None = None  # the last body bytes written to the client: where a cut stream broke


class PhaseClock:
    """Collects the timestamps of one request as they happen; `finish()` derives the phases."""

    __slots__ = (
        "t0", "t_sent", "t_headers", "t_first_byte", "t_first", "t_last", "tokens", "_gaps",
        "reused", "pool_wait", "dns", "connect", "_mark", "t_first_chunk", "t_last_chunk", "_chunk_gaps", "relay",
    )  # fmt: skip

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.t_sent: float | None = None
        self.t_headers: float | None = None
        self.t_first_byte: float | None = None
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.tokens = 0
        self._gaps = array("d")
        self.reused: bool | None = None
        self.pool_wait: float | None = None
        self.dns: float | None = None
        self.connect: float | None = None
        self._mark = t0
        self.t_first_chunk: float | None = None
        self.t_last_chunk = 0.0
        self._chunk_gaps = array("d")
        self.relay = array("d")  # appended to by the relay, once per upstream read

    def mark(self, t: float) -> None:
        """A connection step (pool wait, DNS, connect) started."""
        self._mark = t

    def since_mark(self, t: float) -> float:
        return t - self._mark

    def sent(self, t: float) -> None:
        """The request (headers, then each body chunk) was written upstream."""
        self.t_sent = t

    def headers(self, t: float) -> None:
        if self.t_sent is None:
            self.t_sent = t
        self.t_headers = t

    def body_bytes(self, t: float) -> None:
        if self.t_first_byte is None:
            self.t_first_byte = t

    def token(self, t: float) -> None:
        """One token event arrived (read at time t)."""
        if self.t_first is None:
            self.t_first = t
        else:
            self._gaps.append(t - self.t_last)  # type: ignore[operator]
        self.t_last = t
        self.tokens += 1

    def chunk(self, t: float) -> None:
        """One streamed chunk (token or not) arrived (read at time t)."""
        if self.t_first_chunk is None:
            self.t_first_chunk = t
        else:
            self._chunk_gaps.append(t - self.t_last_chunk)
        self.t_last_chunk = t

    def gaps(self) -> tuple[float, ...]:
        """The inter-token gaps so far (a copy: the live view reads a stream still running)."""
        return tuple(self._gaps)

    def finish(
        self, t_end: float, output_tokens: int | None = None, streaming: bool = True, last_byte: float | None = None
    ) -> RequestTiming:
        """Freeze the phases. `output_tokens` is the reported count when there is one;
        `last_byte`, when the last body bytes were written to the client."""
        t0 = self.t0
        first, last = (self.t_first, self.t_last) if streaming else (None, None)
        tpot = None
        n = output_tokens if output_tokens is not None else self.tokens
        if first is not None and last is not None and n >= 2 and last > first:
            tpot = (last - first) / (n - 1)
        return RequestTiming(
            start=t0,
            end=t_end,
            duration=t_end - t0,
            network=None if self.t_sent is None else self.t_sent - t0,
            time_to_headers=None if self.t_headers is None else self.t_headers - t0,
            ttfb=None if self.t_first_byte is None else self.t_first_byte - t0,
            ttft=None if first is None else first - t0,
            prefill_wait=None if first is None or self.t_sent is None else first - self.t_sent,
            decode=None if first is None or last is None else last - first,
            tpot=tpot,
            itl=tuple(self._gaps) if streaming else (),
            token_events=self.tokens,
            sent=self.t_sent,
            first_token=first,
            last_token=last,
            connection_reused=self.reused,
            pool_wait=self.pool_wait,
            dns=self.dns,
            connect=self.connect,
            ttfc=None if self.t_first_chunk is None or not streaming else self.t_first_chunk - t0,
            chunk_gaps=tuple(self._chunk_gaps) if streaming else (),
            overhead_request=None if self.t_sent is None else self.t_sent_overhead(),
            relay=tuple(self.relay),
            time_to_last_byte=None if last_byte is None else last_byte - t0,
        )

    def t_sent_overhead(self) -> float:
        """The proxy's own time before the request was written: t_sent − t0 without the steps that
        are the network's (pool wait, DNS, connect). 0 before the request was written."""
        if self.t_sent is None:
            return 0.0
        waited = (self.pool_wait or 0.0) + (self.dns or 0.0) + (self.connect or 0.0)
        return max(0.0, self.t_sent - self.t0 - waited)
