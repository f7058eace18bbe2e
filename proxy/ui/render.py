"""JSON for the live view's API, from ring entries. Pure.

A row carries what the requests table shows, plus the first and last tokens' instants on the
host's monotonic clock (for scripts comparing it with another process's clock on the same host); a
detail carries the whole record (every field, so fields added to `RequestRecord` later show up
without a change here), the phase spans as offsets from the request's start (a reasoning model's
`thinking` among them, an estimated one marked so), and the inter-token gaps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from proxy.exchange.record import model_label
from proxy.exchange.timing import RequestTiming
from proxy.ui.ring import SERIES, Entry

__all__ = ["detail", "row"]

# Field names that could hold prompt or completion text: shown only with --capture-content.
_CONTENT_WORDS = ("content", "message", "prompt", "completion", "text")
# Monotonic-clock instants mean nothing to a reader; the spans below carry them as offsets.
_INSTANTS = {"start", "end", "sent", "first_token", "last_token", "thinking_spans"}


def row(e: Entry) -> dict[str, Any]:
    """One line of the requests table."""
    r = e.record
    t = r.timing
    u = r.usage
    return {
        "id": e.id,
        "seq": e.seq,
        "time": e.time,
        "trace_id": r.trace_id,
        "upstream": r.upstream,
        "api": r.api,
        "model": model_label(r.model),  # `unknown` when it named none, as the metrics label it
        "method": r.method,
        "stream": r.stream,
        "status": r.status_code,
        "error_type": r.error_type,
        "ttft": t.ttft,
        "tpot": t.tpot,
        # a reasoning model's: the answer's first token, the thinking measured, or hidden and estimated
        "time_to_first_answer_token": t.time_to_first_answer_token,
        "thinking": t.thinking,
        "thinking_estimated": t.thinking_estimated,
        "duration": t.duration,
        "network": t.network,
        "prefill_wait": t.prefill_wait,
        "decode": t.decode,
        "output_tokens": u.output_tokens,
        "input_tokens": u.input_tokens,
        "cached_input_tokens": u.cached_input_tokens,
        # CLOCK_MONOTONIC seconds (time.perf_counter on Linux), the same clock in every process on
        # the host: what another process's own timestamps can be compared with (the benchmark's).
        "first_token_monotonic": t.first_token,
        "last_token_monotonic": t.last_token,
        "pair_id": r.pair_id,  # --mirror: the primary and its mirror copy share it
        "mirror": r.mirror,
    }


def _is_pair(value: object) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)


def _plain(value: object, capture_content: bool) -> Any:
    """A record (or a part of it) as JSON-able values; unknown types become strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if f.name in _INSTANTS or f.name in SERIES or f.name == "span":
                continue  # instants are offsets in spans; itl is `gaps`; the root span's start is the span observer's
            if not capture_content and any(w in f.name for w in _CONTENT_WORDS):
                continue
            out[f.name] = _plain(getattr(value, f.name), capture_content)
        return out
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple) and value and all(_is_pair(v) for v in value):
        return {k: _plain(v, capture_content) for k, v in value}  # (name, value) pairs, e.g. attributes
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v, capture_content) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, capture_content) for k, v in value.items()}
    return str(value)


def _spans(e: Entry) -> list[dict[str, Any]]:
    """The root and its phase children, as the exporter builds them, in seconds from t0."""
    r = e.record
    t = r.timing
    if r.operation is None:
        name = r.method
    else:
        name = f"{r.operation} {r.model}" if r.model else r.operation
    network: dict[str, Any] = {}
    for key, value in (
        ("taotrace.connection.reused", t.connection_reused),
        ("taotrace.pool_wait", t.pool_wait),
        ("taotrace.dns", t.dns),
        ("taotrace.connect", t.connect),
    ):
        if value is not None:
            network[key] = value
    spans = [
        {"name": name, "start": 0.0, "end": t.duration, "attributes": {}},
        {
            "name": "network",
            "start": 0.0,
            "end": t.network if t.network is not None else t.duration,
            "attributes": network,
        },
    ]
    if t.ttft is not None and t.network is not None:
        prefill: dict[str, Any] = {"name": "prefill_wait", "start": t.network, "end": t.ttft, "attributes": {}}
        rtt = r.tcp.round_trip if r.tcp is not None else None
        if rtt is not None:  # the one network round trip inside it (TCP_INFO, Linux); the rest, server_wait
            prefill["rtt"] = rtt
            prefill["server_wait"] = r.server_wait
        spans.append(prefill)
        thinking = _thinking(t) if t.thinking_spans or t.thinking_estimated is not None else []
        if t.thinking_estimated is not None:
            spans += thinking  # inside prefill_wait: drawn under it
        spans.append(
            {
                "name": "decode",
                "start": t.ttft,
                "end": t.ttft + (t.decode or 0.0),
                "attributes": {"taotrace.token_events": t.token_events},
            }
        )
        if t.thinking_estimated is None:
            spans += thinking
    return spans


def _thinking(t: RequestTiming) -> list[dict[str, Any]]:
    """A reasoning model's `thinking` children, as exported: each streamed reasoning run inside
    decode, or hidden reasoning's estimate at the end of prefill_wait (`estimated`: drawn as one)."""
    assert t.ttft is not None
    if t.thinking_estimated is not None:
        estimated = {"taotrace.estimated": True}
        return [
            {"name": "thinking", "start": t.ttft - t.thinking_estimated, "end": t.ttft, "attributes": estimated,
             "parent": "prefill_wait", "estimated": True}
        ]  # fmt: skip
    runs, t0 = t.thinking_spans, t.start
    return [
        {"name": "thinking", "start": runs[i] - t0, "end": runs[i + 1] - t0, "attributes": {"taotrace.estimated": False},
         "parent": "decode", "estimated": False}
        for i in range(0, len(runs) - 1, 2)
    ]  # fmt: skip


def detail(e: Entry, *, trace_url: str = "", capture_content: bool = False) -> dict[str, Any]:
    """Everything about one request: `/api/requests/{id}`."""
    r = e.record
    t = r.timing
    record = _plain(r, capture_content)
    record["model"] = model_label(r.model)  # as rows and the metrics name it
    return {
        "id": e.id,
        "seq": e.seq,
        "time": e.time,
        # A trace the outcome sampler dropped never reaches the trace viewer: no link to a 404.
        "trace_url": trace_url.replace("{trace_id}", r.trace_id)
        if trace_url and r.trace_id and r.sampling != "dropped"
        else None,
        "record": record,
        "spans": _spans(e),
        "marks": {
            "time_to_headers": t.time_to_headers,
            "ttfb": t.ttfb,
            "ttft": t.ttft,
            "first_answer": t.time_to_first_answer_token,
            "last_byte": t.time_to_last_byte,
        },
        "gaps": {
            "values": list(t.itl),
            "per_bar": e.gaps_per_bar,
            "count": max(0, t.token_events - 1),
        },
    }
