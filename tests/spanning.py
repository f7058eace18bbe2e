"""Ending a request's spans from a record a test built itself, as the span observer does in the
proxy (`Spans.end`): the record carries its root span's start (`Spans.span_start`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from opentelemetry.trace import Status, StatusCode

from proxy.exchange.record import RequestRecord
from proxy.telemetry.span_end import network_attributes
from proxy.telemetry.spans import RootSpan, Spans

# name, start ns, end ns, attributes, error status, parent (-1: the root; else a phase's index)
Phase = tuple[str, int, int, dict[str, Any], Status | None, int]


def finish(
    tel: Spans,
    span: RootSpan,
    rec: RequestRecord,
    output_text: str | None = None,
    *,
    output_value: str | None = None,
) -> None:
    """`span` ended from `rec`, its phase children with it, to `tel`'s processor."""
    start = tel.span_start(span, rec.sampling, output_text, output_value)
    tel.end(dataclasses.replace(rec, span=start))


def phases(rec: RequestRecord, offset: int) -> list[Phase]:
    """(name, start ns, end ns, attributes, error status, parent) of each phase child, as the
    proxy makes them: the reference the SDK's spans are built from in the equivalence tests. A
    reasoning model's `thinking` children sit inside decode (measured) or prefill_wait (estimated)."""
    t = rec.timing

    def ns(x: float) -> int:
        return int(x * 1e9) + offset

    network: dict[str, Any] = dict(network_attributes(t))
    status = Status(StatusCode.ERROR, rec.error_type) if rec.error_type and t.sent is None else None
    out: list[Phase] = [("network", ns(t.start), ns(t.sent) if t.sent is not None else ns(t.end), network, status, -1)]
    if t.sent is not None and t.first_token is not None:
        sent, first = ns(t.sent), ns(t.first_token)
        last = ns(t.last_token) if t.last_token is not None else first
        out.append(("prefill_wait", sent, first, {}, None, -1))
        out.append(("decode", first, last, {"taotrace.token_events": t.token_events}, None, -1))
        if t.thinking_estimated is not None:
            hidden = first - int(t.thinking_estimated * 1e9)
            out.append(("thinking", hidden, first, {"taotrace.estimated": True}, None, 1))
        runs = t.thinking_spans
        for i in range(0, len(runs), 2):
            out.append(("thinking", ns(runs[i]), ns(runs[i + 1]), {"taotrace.estimated": False}, None, 2))
    return out
