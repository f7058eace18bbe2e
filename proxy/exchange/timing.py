"""The phase clock: timestamps in, a frozen `RequestTiming` out. Pure: the caller owns the clock.

    t0 ─ network ─ t_sent ─ prefill_wait ─ t_first ─ decode ─ t_last ─ (tail) ─ t_end

TTFT = t_first − t0; TPOT = (t_last − t_first) / (output_tokens − 1) (vLLM: the first token is
excluded); ITL = gaps between consecutive token events; duration = t_end − t0.

A reasoning model's stream is two kinds of token (`dialects.ANSWER`, `REASONING`): the answer's
first token gets its own time (`time_to_first_answer_token`), and the time it spent on streamed
reasoning before it is the thinking phase (`thinking`, inside decode). Reasoning the upstream
only counts (`reasoning_tokens` in its usage, nothing streamed) is estimated, never measured:
`thinking_estimated`, a split of prefill_wait. docs/timing.md defines each number.

A *chunk* (OpenTelemetry GenAI's word) is one streamed item a client SDK would yield: any SSE
event with data except `[DONE]` and `ping` (see `dialects.is_chunk`), token or not. TTFC =
first chunk − t0; the chunk gaps feed `gen_ai.client.operation.time_per_output_chunk`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from proxy.dialects import ANSWER, REASONING

__all__ = ["MAX_THINKING_SPANS", "PhaseClock", "RequestTiming"]

MAX_THINKING_SPANS = 32  # reasoning runs kept as (start, end) for spans; all of them are counted


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
    # Reasoning (docs/timing.md). Streamed: the answer's first token, the thinking before it, every
    # reasoning run (interleaved thinking) as (start, end) instants. Hidden: only the estimate.
    time_to_first_answer_token: float | None = None
    thinking: float | None = None  # first token (a reasoning one) -> first answer token
    thinking_total: float | None = None  # every reasoning run, interleaved ones included
    thinking_spans: tuple[float, ...] = ()  # start, end of each run (the first MAX_THINKING_SPANS)
    reasoning_token_events: int = 0
    answer_tpot: float | None = None  # the answer's own time per output token
    thinking_estimated: float | None = None  # hidden reasoning: an estimate, never measured


@dataclass(frozen=True, slots=True)
class _Reasoning:
    """The reasoning fields of one stream's timing, as `PhaseClock.finish` derives them."""

    thinking: float | None = None
    total: float | None = None
    spans: tuple[float, ...] = ()
    events: int = 0
    answer_tpot: float | None = None
    estimated: float | None = None


_NO_REASONING = _Reasoning()


class PhaseClock:
    """Collects the timestamps of one request as they happen; `finish()` derives the phases."""

    __slots__ = (
        "t0", "t_sent", "t_headers", "t_first_byte", "t_first", "t_last", "tokens", "_gaps",
        "reused", "pool_wait", "dns", "connect", "_mark", "t_first_chunk", "t_last_chunk", "_chunk_gaps", "relay",
        "kind", "t_first_answer", "_thought_first", "_run_start", "_run_tokens", "_thinking", "_reasoning", "_runs",
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
        self.kind = 0  # the last token's kind (ANSWER, REASONING); 0 before the first
        self.t_first_answer: float | None = None
        self._thought_first = False  # the first token was reasoning: the thinking phase came first
        self._run_start = 0.0  # the reasoning run under way: its first token's instant and index
        self._run_tokens = 0
        self._thinking = 0.0  # the reasoning runs ended so far: their time and token events
        self._reasoning = 0
        self._runs = array("d")  # their (start, end) instants, the first MAX_THINKING_SPANS

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

    def token(self, t: float, kind: int = ANSWER) -> None:
        """One token event of `kind` (`ANSWER`, `REASONING`) arrived (read at time t)."""
        if kind != self.kind:  # only where the stream turns: the answer begins, or thinking (again)
            self._turn(t, kind)
        if self.t_first is None:
            self.t_first = t
        else:
            self._gaps.append(t - self.t_last)  # type: ignore[operator]
        self.t_last = t
        self.tokens += 1

    def _turn(self, t: float, kind: int) -> None:
        """The token at `t` is of another kind than the last: a reasoning run ends at the answer
        token that follows it, and one begins at a reasoning token."""
        if self.kind == REASONING:
            self._thinking += t - self._run_start
            self._reasoning += self.tokens - self._run_tokens
            if len(self._runs) < 2 * MAX_THINKING_SPANS:
                self._runs.extend((self._run_start, t))
        if kind == REASONING:
            self._run_start = t
            self._run_tokens = self.tokens
            if self.t_first is None:
                self._thought_first = True
        elif self.t_first_answer is None:
            self.t_first_answer = t
        self.kind = kind

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
        self,
        t_end: float,
        output_tokens: int | None = None,
        streaming: bool = True,
        last_byte: float | None = None,
        reasoning_tokens: int | None = None,
    ) -> RequestTiming:
        """Freeze the phases. `output_tokens` is the reported count when there is one, and
        `reasoning_tokens` the reported part of it that was reasoning; `last_byte`, when the last
        body bytes were written to the client."""
        t0 = self.t0
        first, last = (self.t_first, self.t_last) if streaming else (None, None)
        tpot = None
        n = output_tokens if output_tokens is not None else self.tokens
        if first is not None and last is not None and n >= 2 and last > first:
            tpot = (last - first) / (n - 1)
        answer = self.t_first_answer if streaming else None
        r = _NO_REASONING
        if first is not None and last is not None and (self.kind == REASONING or self._reasoning or reasoning_tokens):
            r = self._reasoning_of(first, last, n, reasoning_tokens)
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
            time_to_first_answer_token=None if answer is None else answer - t0,
            thinking=r.thinking,
            thinking_total=r.total,
            thinking_spans=r.spans,
            reasoning_token_events=r.events,
            answer_tpot=r.answer_tpot,
            thinking_estimated=r.estimated,
        )

    def _reasoning_of(self, first: float, last: float, n: int, reported: int | None) -> _Reasoning:
        """A stream's reasoning numbers (docs/timing.md): measured from its reasoning runs when
        reasoning was streamed; estimated (prefill_wait's hidden share) when the upstream reported
        reasoning tokens it never streamed."""
        total, events, spans = self._thinking, self._reasoning, tuple(self._runs)
        if self.kind == REASONING:  # the stream ended thinking: its last run ends at its last token
            total += last - self._run_start
            events += self.tokens - self._run_tokens
            if len(spans) < 2 * MAX_THINKING_SPANS:
                spans += (self._run_start, last)
        # The answer's tokens: the output less the reported reasoning; without a report, the
        # answer's token events when reasoning was streamed (no other split is known), else all.
        if reported is not None:
            answer_tokens = n - reported
        else:
            answer_tokens = self.tokens - events if events else n
        answer_time = last - first - total  # the reasoning runs and the answer's partition decode
        answer_tpot = answer_time / (answer_tokens - 1) if answer_tokens >= 2 and answer_time > 0 else None
        if events:
            thinking = None
            if self._thought_first:  # until the answer began, or (none came) the last token
                thinking = (last if self.t_first_answer is None else self.t_first_answer) - first
            return _Reasoning(thinking, total, spans, events, answer_tpot)
        estimated = None
        if reported and answer_tpot is not None and self.t_sent is not None:
            # Hidden: the reported reasoning at the answer's own pace, within the wait it hid in.
            estimated = min(reported * answer_tpot, first - self.t_sent)
        return _Reasoning(answer_tpot=answer_tpot, estimated=estimated)

    def t_sent_overhead(self) -> float:
        """The proxy's own time before the request was written: t_sent − t0 without the steps that
        are the network's (pool wait, DNS, connect). 0 before the request was written."""
        if self.t_sent is None:
            return 0.0
        waited = (self.pool_wait or 0.0) + (self.dns or 0.0) + (self.connect or 0.0)
        return max(0.0, self.t_sent - self.t0 - waited)
