"""One request through the proxy: what its handler learns as it goes, and what the live view
reads of it while it runs. Facts only: `outcome.decide` judges them once, when it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from proxy.config.routes import Route
from proxy.dialects import REASONING, Dialect, RequestInfo
from proxy.errors import ErrorType
from proxy.exchange.inflight import Counted, InFlight
from proxy.exchange.outcome import End, Facts
from proxy.exchange.relay import Relay
from proxy.exchange.timing import PhaseClock
from proxy.upstream import UpstreamResponse
from proxy.upstream.tcpinfo import TcpInfo, TcpStats, request_stats

__all__ = ["Exchange", "server_timing"]


class Exchange:
    """One request through the proxy, as its handler learns about it: facts only, no judgement
    (`facts()` hands them to `outcome.decide` when it ends)."""

    __slots__ = (
        "client_headers", "counted", "dialect", "end", "head_sent", "info", "method", "mirror", "pair_id", "path",
        "phase", "refused", "relay", "route", "span", "status", "task", "tcp_end", "trace_id_of", "upstream",
    )  # fmt: skip

    def __init__(
        self,
        method: str,
        path: str,
        info: RequestInfo,
        phase: PhaseClock,
        span: Any,
        client_headers: Mapping[str, str],
        route: Route,
        dialect: Dialect | None = None,
        *,
        trace_id_of: Callable[[Any], str | None] = lambda span: None,
        task: asyncio.Task[Any] | None = None,
    ) -> None:
        """`span`: the tracer's root span (`proxy.exchange.tracer`), whose trace id
        `trace_id_of` reads when the live view asks; `task`: the one relaying it."""
        self.route = route
        self.dialect = dialect  # None: `other`, forwarded and counted, not parsed
        self.pair_id: str | None = None  # --mirror: shared by the request and its copy
        self.mirror = False  # this is the copy
        self.method = method
        self.path = path
        self.info = info
        self.phase = phase
        self.span = span
        self.client_headers = client_headers
        self.status = 502  # what the client got; 502 until the upstream answered
        self.refused: ErrorType | None = None  # the proxy answered itself (`status`), with this word
        self.end: End = "complete"  # how it ended (see proxy/exchange/outcome.py)
        self.head_sent = False  # the response head went to the client
        self.upstream: UpstreamResponse | None = None
        self.relay: Relay | None = None
        self.tcp_end: TcpInfo | None = None  # the upstream connection's TCP_INFO as the request ended
        self.trace_id_of = trace_id_of
        self.task = task
        self.counted: Counted | None = None  # its child of the in-flight gauge (a copy has none)

    def in_flight(self, now: float, wall: float, gaps: bool) -> InFlight:
        """What is known so far, read from the phase clock and the relay (the live view, on poll)."""
        phase, relay, upstream, info = self.phase, self.relay, self.upstream, self.info
        t0 = phase.t0
        streaming = info.stream or (relay is not None and relay.decoder is not None)
        if phase.tokens:
            reached = "thinking" if phase.kind == REASONING else "decode"
        elif phase.t_headers is None:
            reached = "network" if phase.t_sent is None else "headers"
        else:
            reached = "prefill_wait" if streaming else "response"
        trace_id = self.trace_id_of(self.span)
        written = relay.t_written if relay is not None else None
        return InFlight(
            id=trace_id or f"live-{id(self):x}",
            trace_id=trace_id,
            api=info.api,
            operation=info.operation,
            model=info.model,
            method=self.method,
            stream=streaming,
            upstream=self.route.name,
            started=wall - (now - t0),
            elapsed=now - t0,
            phase=reached,
            status=upstream.status if upstream is not None else None,
            network=None if phase.t_sent is None else phase.t_sent - t0,
            time_to_headers=None if phase.t_headers is None else phase.t_headers - t0,
            ttfb=None if phase.t_first_byte is None else phase.t_first_byte - t0,
            ttft=None if phase.t_first is None else phase.t_first - t0,
            last_token=None if phase.t_last is None else phase.t_last - t0,
            last_byte=None if written is None else written - t0,
            output_tokens=phase.tokens,
            gaps=phase.gaps() if gaps else (),
            first_answer=None if phase.t_first_answer is None else phase.t_first_answer - t0,
        )

    def facts(self) -> Facts:
        """What this exchange saw, for `decide`. Before `release_upstream`: a pooled connection
        no longer knows that it was read to its end."""
        relay, upstream, status = self.relay, self.upstream, self.status
        if relay is None:
            return Facts(status=status, refused=self.refused, end=self.end)
        copy = relay.copy
        return Facts(
            status=status,
            refused=self.refused,
            end="internal" if relay.failure is not None else self.end,  # then the client's leaving is our doing
            whole=relay.done or (upstream is not None and upstream.complete and not relay.lost),
            stream_error=relay.stream_error,
            unfinished=relay.unfinished,
            error_head=bytes(copy[:4096]) if copy is not None and status >= 400 else b"",
        )

    def release_upstream(self) -> None:
        """The connection back to the pool after a full read; the rest read in the background when
        the client already has the whole answer; dropped otherwise."""
        upstream, relay = self.upstream, self.relay
        if upstream is None:
            return
        self.tcp_end = upstream.end_tcp()  # before the connection is pooled or discarded
        if relay is not None and relay.done and not upstream.complete:
            upstream.discard_rest()  # keep the connection if the rest comes soon
        else:
            upstream.close()

    def tcp(self) -> TcpStats | None:
        """The upstream connection's TCP_INFO over this request (after `release_upstream`)."""
        if self.upstream is None:
            return None
        first = self.relay.tcp_first if self.relay is not None else None
        return request_stats(self.upstream.tcp_start, first, self.tcp_end)


def server_timing(phase: PhaseClock) -> str:
    """The `Server-Timing` value (W3C; durations in ms) of what is known when the head is sent."""
    sent, headers = phase.t_sent, phase.t_headers
    if sent is None or headers is None:
        return ""
    proxy = phase.t_sent_overhead()
    return f"network;dur={(sent - phase.t0) * 1e3:.3f}, proxy;dur={proxy * 1e3:.3f}, upstream;dur={(headers - sent) * 1e3:.3f}"
