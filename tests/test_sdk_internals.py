"""The OpenTelemetry releases whose private internals proxy/telemetry/sdk_internals.py relies on.

An upgrade must be deliberate: when the installed versions differ from the verified ones, this
fails, naming them. Then rerun tests/test_telemetry_fast.py and tests/test_telemetry_otlp.py
(they pin the fast paths' output to the SDK's), re-read the private names listed in
sdk_internals' docstring in the new release, and move VERIFIED and pyproject.toml's pins.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.telemetry.sdk_internals import VERIFIED

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parent.parent


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_installed_opentelemetry_is_the_verified_release() -> None:
    installed = {name: importlib.metadata.version(name) for name in VERIFIED}
    wrong = {name: v for name, v in installed.items() if _minor(v) != VERIFIED[name]}
    assert not wrong, (
        f"OpenTelemetry {wrong} installed, but proxy/telemetry/sdk_internals.py was verified against "
        f"{ {n: VERIFIED[n] for n in wrong} }: read its docstring before upgrading"
    )


def test_pyproject_pins_the_verified_minor_versions() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        m = re.fullmatch(r"(opentelemetry-[a-z-]+)~=(\d+\.\d+)\.\d+", dep.replace(" ", ""))
        if dep.startswith("opentelemetry"):
            assert m, f"{dep}: pin OpenTelemetry packages as ~=X.Y.Z (compatible within the verified minor)"
            pins[m.group(1)] = m.group(2)
    assert pins, "no OpenTelemetry pins in pyproject.toml"
    for name, minor in pins.items():
        assert VERIFIED.get(name, minor) == minor, name
    assert {"opentelemetry-sdk", "opentelemetry-exporter-otlp"} <= set(pins)
    # What the pinned packages bring in must be the verified release too.
    for name in VERIFIED:
        assert _minor(importlib.metadata.version(name)) == VERIFIED[name]


def test_the_root_attribute_bound_is_the_most_a_root_can_carry() -> None:
    """`_MAX_ROOT_ATTRIBUTES` (the fast root path runs only under an attribute count limit at least
    this high) is computed here: a request that sets every attribute the root can have, counted on
    the finished span. A new attribute fails this until the bound is moved."""
    from proxy.telemetry.sdk_internals import _MAX_ROOT_ATTRIBUTES

    most = max(maximal_infos(), key=lambda i: len(i.params) + (i.system_instructions is not None))
    assert most.input_messages is not None
    (root,) = [s for s in maximal_spans(most) if s.parent is None]
    assert root.attributes is not None
    assert len(root.attributes) == _MAX_ROOT_ATTRIBUTES, sorted(root.attributes)


def maximal_infos() -> list[Any]:
    """Each dialect's `RequestInfo` for a body setting every parameter any dialect reads, with
    content captured and the end user asked for."""

    from proxy import dialects

    # Every request parameter any dialect reads, and a structured-output request.
    samples = {int: 2, float: 0.5, list: ["x"]}
    body: dict[str, object] = {k: samples[kind] for d in dialects.DIALECTS for k, _, kind in d.params}
    body |= {"model": "m", "stream": True, "user": "u", "messages": [{"role": "user", "content": "hi"}]}
    body |= {"response_format": {"type": "json_object"}, "text": {"format": {"type": "json_schema"}}}
    body |= {"system": "s", "instructions": "i"}  # instructions given apart: gen_ai.system_instructions
    body |= {"prompt": "p", "input": "i", "metadata": {"user_id": "u"}}  # the other dialects' input and user
    return [d.inspect(orjson.dumps(body), capture_content=True, end_user=True) for d in dialects.DIALECTS]


def maximal_spans(info: Any) -> list[Any]:
    """The finished spans of a request of `info` that sets every attribute the root can have."""
    import dataclasses

    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from yarl import URL

    from proxy import dialects
    from proxy.accounting.attribution import MAX_HEADER_ATTRIBUTES, Attributor, HeaderAttribute
    from proxy.accounting.prices import Cost
    from proxy.accounting.ratelimits import KINDS, read_rate_limits
    from proxy.record import RequestRecord
    from proxy.routes import Route
    from proxy.tcpinfo import TcpStats
    from proxy.telemetry.spans import Telemetry
    from proxy.timing import RequestTiming

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
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=10_000))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(
        provider, upstream_host="up", upstream_port=8000, upstream_base="http://up:8000", capture_content=True
    )
    route = Route("r", "/r", URL("http://up:8000/api"))
    span = telemetry.start(info, "POST", "/v1/chat/completions", "key=x", {}, 0.0, route)
    telemetry.finish(span, record, output_text="[]")
    return list(exporter.get_finished_spans())
