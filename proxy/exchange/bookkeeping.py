"""When an exchange ends: its outcome decided once, its record built, every observer fed.

The bookkeeping of a request runs after its client has the last byte, queued (`Finishing`)
while other requests run, so it never delays another stream's bytes. The record takes what the
tracer concludes of the request (its trace id, the outcome sampling decision, its root span's
start for the span observer); what the observers then do with it is theirs (`observers.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from proxy.accounting.attribution import Attributor
from proxy.accounting.prices import Cost, PriceTable, cost_of
from proxy.accounting.ratelimits import read_rate_limits
from proxy.dialects import Usage
from proxy.errors import ProxyError
from proxy.exchange.exchange import Exchange
from proxy.exchange.finishing import Finishing
from proxy.exchange.inflight import InFlightRequests
from proxy.exchange.observers import Observers
from proxy.exchange.outcome import Facts, Outcome, decide
from proxy.exchange.record import RequestRecord, Traced, usage_of
from proxy.exchange.relay import MAX_BODY_COPY
from proxy.exchange.timing import PhaseClock
from proxy.exchange.tracer import Tracer

__all__ = ["RING_CONTENT_LIMIT", "Bookkeeper"]

Clock = Callable[[], float]

_UNTRACED = Traced()
RING_CONTENT_LIMIT = 64 << 10  # captured input kept on a record (the live view's ring holds 1,000 of them)


class Bookkeeper:
    """Turns finished exchanges into records for the observers."""

    def __init__(
        self,
        observers: Observers[RequestRecord],
        tracer: Tracer[Any],
        running: InFlightRequests,
        *,
        clock: Clock = time.perf_counter,
        wall_clock: Clock = time.time,
        capture_content: bool = False,
        capture_io_values: bool = False,
        attributor: Attributor | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        self.observers = observers
        self.tracer = tracer
        self.running = running
        self.clock = clock
        self.wall_clock = wall_clock  # epoch seconds: rate-limit resets given as dates
        self.capture_content = capture_content
        self.capture_io_values = capture_io_values and capture_content
        self.attributor = attributor
        self.prices = prices
        self.queue = Finishing()  # finished requests whose bookkeeping is still to do

    def later(self, x: Exchange, facts: Facts) -> None:
        """The request's bookkeeping, its end stamped now: queued (see `Finishing`) while other
        requests are in flight or others are queued; done at once otherwise (no other
        connection's bytes can be waiting behind it, and the record is there when the client
        has its answer)."""
        t_end = self.clock()
        if self.running or self.queue:
            self.queue.add(lambda: self.finish(x, facts, t_end))
        else:
            self.finish(x, facts, t_end)

    def flush(self) -> None:
        """Record every finished request still queued (at exit, before the observers flush)."""
        self.queue.flush()

    def finish(self, x: Exchange, facts: Facts, t_end: float) -> None:
        """The request's outcome, decided once from what `x` saw; its record, to every observer.
        `t_end`: when the handler was done with it (the end of a request not timed to its last byte)."""
        try:
            record = self.record(x, decide(facts), t_end)
        except Exception as exc:  # noqa: BLE001 - counted and logged: telemetry never breaks a request
            self.observers.failed("record", exc)
            return
        self.observers(record)

    def record(self, x: Exchange, outcome: Outcome, t_done: float) -> RequestRecord:
        """The record of a finished exchange."""
        info, phase, relay = x.info, x.phase, x.relay
        reader = relay.reader if relay is not None else None  # None if parsing gave up midway
        copy = relay.copy if relay is not None else None
        last_byte = relay.t_written if relay is not None else None
        t_end = last_byte if outcome.at_last_byte and last_byte is not None else t_done
        if copy is not None and not outcome.error_type and len(copy) < MAX_BODY_COPY and x.dialect is not None:
            reader = x.dialect.read_body(bytes(copy), self.capture_content)  # a whole (< 400) body
        streaming = info.stream or phase.tokens > 0
        usage, source = usage_of(reader, streaming, phase.tokens)
        timing = phase.finish(
            t_end,
            usage.output_tokens,
            streaming=streaming,
            last_byte=last_byte,
            reasoning_tokens=usage.reasoning_tokens,
        )
        response_model = reader.response_model if reader is not None else None
        text = reader.output_messages if reader is not None else None
        value = reader.output_value if reader is not None and self.capture_io_values else None
        try:
            traced = self.tracer.conclude(x.span, outcome.error_type, timing, text, value)
        except Exception as exc:  # noqa: BLE001 - counted and logged; the record still goes to the observers
            self.observers.failed("spans", exc)
            traced = _UNTRACED
        return RequestRecord(
            trace_id=traced.trace_id,
            upstream=x.route.name,
            pair_id=x.pair_id,
            mirror=x.mirror,
            api=info.api,
            operation=info.operation,
            model=info.model,
            response_model=response_model,
            stream=streaming,
            method=x.method,
            path=x.path,
            status_code=outcome.status,
            error_type=outcome.error_type,
            timing=timing,
            usage=usage,
            usage_source=source,
            finish_reasons=tuple(reader.finish_reasons) if reader is not None else (),
            response_id=reader.response_id if reader is not None else None,
            provider=info.provider,
            sampling=traced.sampling,
            attributes=self.attributor(x.client_headers, info.end_user) if self.attributor is not None else (),
            rate_limits=read_rate_limits(
                x.upstream.headers if x.upstream is not None else (), self._wall_time_of(phase.t_headers)
            ),
            cost=self._cost(info.model, response_model, usage, source),
            tcp=x.tcp(),
            span=traced.span,
            input_content=info.content
            if info.content is not None and len(info.content) <= RING_CONTENT_LIMIT
            else None,
        )

    def _wall_time_of(self, t: float | None) -> float:
        """Epoch seconds of monotonic time `t` (now when None): rate-limit resets count from the headers."""
        now = self.clock()
        return self.wall_clock() - (now - (t if t is not None else now))

    def _cost(self, model: str | None, response_model: str | None, usage: Usage, source: str) -> Cost | None:
        """Priced when the upstream reported the input: with its output, or with the output counted
        when the stream ended before its final usage (Anthropic reports the input first; the
        upstream bills at least what it streamed). A count alone lacks the input: a guess, never priced."""
        if self.prices is None or (source != "reported" and usage.input_tokens is None):
            return None
        return cost_of(self.prices, usage, model, response_model)

    def refused(self, api: str, method: str, path: str, exc: ProxyError, t0: float, upstream: str) -> None:
        """A request refused before forwarding still counts (and is timed) in the metrics."""
        timing = PhaseClock(t0).finish(self.clock(), streaming=False)
        record = RequestRecord(
            trace_id=None,
            upstream=upstream,
            api=api,
            operation=None,
            model=None,
            response_model=None,
            stream=False,
            method=method,
            path=path,
            status_code=exc.status,
            error_type=exc.error_type,
            timing=timing,
            usage=Usage(),
            usage_source="none",
            finish_reasons=(),
            response_id=None,
        )
        self.observers(record)
