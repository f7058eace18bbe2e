"""JSON for the requests still running, from `InFlight` snapshots. Pure.

A running row carries what the requests table shows while it runs (the phase reached, the
elapsed time, tokens so far); a running detail has the shape of a finished one (`render.detail`)
with the spans drawn up to now, so the page draws both with one waterfall.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from proxy.exchange.inflight import InFlight
from proxy.exchange.record import model_label
from proxy.ui.ring import MAX_GAPS, Query, compact_gaps

__all__ = ["running_detail", "running_matches", "running_row"]


def running_row(f: InFlight) -> dict[str, Any]:
    """One running line of the requests table (every field but the gaps)."""
    out = {field.name: getattr(f, field.name) for field in dataclasses.fields(f) if field.name != "gaps"}
    out["model"] = model_label(f.model)  # as a finished row names it
    out["in_flight"] = True
    return out


def running_matches(f: InFlight, q: Query) -> bool:
    """The table's filters, read for a request that has not ended: no error yet; slow by its
    first token, or without one by the time it has run so far."""
    if q.errors:
        return False
    if q.api is not None and f.api != q.api:
        return False
    if q.model is not None and model_label(f.model) != q.model:
        return False
    return q.slow is None or (f.ttft if f.ttft is not None else f.elapsed) >= q.slow


def _spans(f: InFlight) -> list[dict[str, Any]]:
    """The root and its phase children as they will be exported, each ending now if still open."""
    if f.operation is None:
        name = f.method
    else:
        name = f"{f.operation} {f.model}" if f.model else f.operation
    now = f.elapsed
    spans = [
        {"name": name, "start": 0.0, "end": now, "attributes": {}},
        {"name": "network", "start": 0.0, "end": f.network if f.network is not None else now, "attributes": {}},
    ]
    if f.stream and f.network is not None:
        spans.append(
            {"name": "prefill_wait", "start": f.network, "end": f.ttft if f.ttft is not None else now, "attributes": {}}
        )
        if f.ttft is not None:
            attributes = {"taotrace.token_events": f.output_tokens}
            spans.append({"name": "decode", "start": f.ttft, "end": now, "attributes": attributes})
            if f.first_answer != f.ttft and (f.phase == "thinking" or f.first_answer is not None):
                # A reasoning model thinking before its answer (later runs show once it ends)
                end = f.first_answer if f.first_answer is not None else now
                spans.append(
                    {"name": "thinking", "start": f.ttft, "end": end, "attributes": {"taotrace.estimated": False},
                     "parent": "decode", "estimated": False}
                )  # fmt: skip
    return spans


def running_detail(f: InFlight) -> dict[str, Any]:
    """One running request, shaped as `/api/requests/{id}` answers for a finished one."""
    gaps, per_bar = compact_gaps(f.gaps, MAX_GAPS)
    return {
        "id": f.id,
        "seq": None,
        "time": f.started,
        "in_flight": True,
        "trace_url": None,  # nothing is exported before the request ends
        "record": running_row(f),
        "spans": _spans(f),
        "marks": {
            "time_to_headers": f.time_to_headers,
            "ttfb": f.ttfb,
            "ttft": f.ttft,
            "first_answer": f.first_answer,
            "last_byte": f.last_byte,
        },  # fmt: skip
        "gaps": {"values": list(gaps), "per_bar": per_bar, "count": max(0, f.output_tokens - 1)},
    }
