"""The most a request can put on its spans: every parameter, attribute and limit set at once.

Used by tests/test_spec_table.py (every emitted name) and tests/test_spans.py (the root never
reaches the default attribute count limit).
"""

from __future__ import annotations

from typing import Any

import orjson


def maximal_infos() -> list[Any]:
    """Each dialect's `RequestInfo` for a body setting every parameter any dialect reads, with
    content captured (and its plain input value) and the end user asked for."""

    from proxy import dialects

    # Every request parameter any dialect reads, and a structured-output request.
    samples = {int: 2, float: 0.5, list: ["x"]}
    body: dict[str, object] = {k: samples[kind] for d in dialects.DIALECTS for k, _, kind in d.params}
    body |= {"model": "m", "stream": True, "user": "u", "messages": [{"role": "user", "content": "hi"}]}
    body |= {"response_format": {"type": "json_object"}, "text": {"format": {"type": "json_schema"}}}
    body |= {"system": "s", "instructions": "i"}  # instructions given apart: gen_ai.system_instructions
    body |= {"prompt": "p", "input": "i", "metadata": {"user_id": "u"}}  # the other dialects' input and user
    return [
        d.inspect(orjson.dumps(body), capture_content=True, end_user=True, io_values=True) for d in dialects.DIALECTS
    ]


def maximal_spans(info: Any) -> list[Any]:
    """The finished spans of a request of `info` that sets every attribute the root can have."""
    import dataclasses

    from yarl import URL

    from proxy import dialects
    from proxy.accounting.attribution import MAX_HEADER_ATTRIBUTES, Attributor, HeaderAttribute
    from proxy.accounting.prices import Cost
    from proxy.accounting.ratelimits import KINDS, read_rate_limits
    from proxy.config.routes import Route
    from proxy.exchange.record import RequestRecord
    from proxy.exchange.timing import RequestTiming
    from proxy.telemetry.span_pipeline import InMemorySpanExporter, SimpleSpanProcessor
    from proxy.telemetry.spans import Spans
    from proxy.telemetry.tracing import Tracing
    from proxy.upstream.tcpinfo import TcpStats
    from tests.spanning import finish

    assert info.content is not None and info.end_user == "u"
    # Attribution at its bound (every header mapped, the key's id, the body's user), every rate limit.
    mapped = tuple(HeaderAttribute(header=f"x-h{i}", attribute=f"app.h{i}") for i in range(MAX_HEADER_ATTRIBUTES))
    headers = {"Authorization": "Bearer k", **{f"x-h{i}": "v" for i in range(MAX_HEADER_ATTRIBUTES)}}
    attributes = Attributor(mapped, body_user=True, salt=b"s")(headers, info.end_user)
    limit_headers = [
        (f"anthropic-ratelimit-{kind.replace('_', '-')}-{field}", "2026-12-04T00:00:10Z" if field == "reset" else "5")
        for kind in KINDS
        for field in ("limit", "remaining", "reset")
    ] + [("retry-after", "3")]
    rate_limits = read_rate_limits(limit_headers, now=1_796_342_400.0)
    every: dict[str, Any] = {
        f.name: (1.0,) if str(f.type).startswith("tuple") else 1.0 for f in dataclasses.fields(RequestTiming)
    }
    timing = RequestTiming(**every)
    timing = dataclasses.replace(timing, token_events=3, connection_reused=True)
    record = RequestRecord(
        trace_id="0" * 32, api=info.api, operation=info.operation, model=info.model, response_model="m2",
        stream=True, method="POST", path="/v1/chat/completions", status_code=200, error_type="stream_cut",
        timing=timing, usage=dialects.Usage(**{f.name: 1 for f in dataclasses.fields(dialects.Usage)}),
        usage_source="reported", finish_reasons=("stop",), response_id="r", provider="openai", sampling="error",
        attributes=attributes, rate_limits=rate_limits, cost=Cost(amount=0.1, cache_savings=0.0, currency="USD"),
        tcp=TcpStats(rtt=0.001, rtt_var=0.001, min_rtt=0.001, retransmits=1, out_of_order=1, delivery_rate=1),
        upstream="r", pair_id="p", mirror=True, input_content="[]",
    )  # fmt: skip
    unset = [
        f.name for f in dataclasses.fields(record) if getattr(record, f.name) in (None, (), "") and f.name != "span"
    ]
    assert not unset, f"the maximal record leaves {unset} unset: set them, so their attributes are counted"
    assert len(rate_limits.limits) == len(KINDS) and rate_limits.retry_after is not None

    exporter = InMemorySpanExporter()
    telemetry = Spans(
        Tracing(processor=SimpleSpanProcessor(exporter)),
        upstream_host="up",
        upstream_port=8000,
        upstream_base="http://up:8000",
        capture_content=True,
        capture_io_values=True,
    )
    route = Route("r", "/r", URL("http://up:8000/api"))
    span = telemetry.start(info, "POST", "/v1/chat/completions", "key=x", {}, 0.0, route)
    finish(telemetry, span, record, output_text="[]", output_value="a")
    return list(exporter.get_finished_spans())
