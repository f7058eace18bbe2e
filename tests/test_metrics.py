"""Metric names and labels of the contract, exemplars, bounded model labels, the metrics port."""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections.abc import Iterable
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from proxy.errors import ProxyError, error_type_for_status
from proxy.telemetry import exposition
from proxy.telemetry.metrics import BUCKETS_LATENCY, BUCKETS_TOKEN, ERROR_TYPES, Metrics, ModelLabels
from tests.conftest import Proxied
from tests.fakes import chat_stream, record_for, stream_handler

CONTRACT = {
    "taotrace_requests": ("counter", {"upstream", "api", "model", "status_code", "error_type"}),
    "taotrace_request_duration_seconds": ("histogram", {"upstream", "api", "model"}),
    "taotrace_time_to_first_token_seconds": ("histogram", {"upstream", "api", "model"}),
    # a reasoning model's: the answer's first token, and the streamed thinking before it
    "taotrace_time_to_first_answer_token_seconds": ("histogram", {"upstream", "api", "model"}),
    "taotrace_thinking_seconds": ("histogram", {"upstream", "api", "model"}),
    "taotrace_time_per_output_token_seconds": ("histogram", {"upstream", "api", "model"}),
    "taotrace_inter_token_latency_seconds": ("histogram", {"upstream", "api", "model"}),
    "taotrace_phase_duration_seconds": ("histogram", {"upstream", "api", "model", "phase"}),
    "taotrace_tokens": ("counter", {"upstream", "api", "model", "type"}),
    "taotrace_in_flight_requests": ("gauge", {"upstream", "api"}),
    "taotrace_proxy_overhead_seconds": ("histogram", {"upstream", "api", "stage"}),  # second round
    # second round (issue 14): rate limits and cost; no samples until an upstream sends the
    # headers / a price table is given
    "taotrace_ratelimit_remaining": ("gauge", {"upstream", "model", "kind"}),
    "taotrace_ratelimit_limit": ("gauge", {"upstream", "model", "kind"}),
    "taotrace_ratelimit_reset_timestamp_seconds": ("gauge", {"upstream", "model", "kind"}),
    "taotrace_cost": ("counter", {"upstream", "api", "model"}),
    "taotrace_cost_unpriced_requests": ("counter", {"upstream", "api", "model"}),
    "taotrace_cost_cache_savings": ("counter", {"upstream", "api", "model"}),
    "taotrace_worker_restarts": ("counter", set()),
    "taotrace_spans_dropped": ("counter", {"reason"}),
    "taotrace_upstream_rtt_seconds": ("histogram", {"upstream", "api", "model"}),
    "taotrace_upstream_retransmits": ("counter", {"upstream", "api", "model"}),
    # --mirror (no samples unless it is on)
    "taotrace_compare_ttft_difference_seconds": ("histogram", {"upstream", "mirror", "api", "model", "direction"}),
    "taotrace_compare_tpot_difference_seconds": ("histogram", {"upstream", "mirror", "api", "model", "direction"}),
    "taotrace_mirror_requests": ("counter", {"upstream", "api", "error_type"}),
    "taotrace_mirror_dropped": ("counter", {"reason"}),
    "taotrace_sink_errors": ("counter", {"sink"}),
}
BOTH_MODES = pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)  # one process, and --workers 2


async def scrape(proxy: Proxied, accept: str = "") -> tuple[str, str]:
    async with aiohttp.ClientSession() as s:
        async with s.get(proxy.metrics_url + "/metrics", headers={"Accept": accept} if accept else {}) as r:
            assert r.status == 200
            return r.headers["Content-Type"], await r.text()


@BOTH_MODES
async def test_names_types_and_labels_match_the_contract(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    proxy.serve(stream_handler(chat_stream(3)))
    async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
        await r.read()
    await proxy.settled(1)
    _, text = await scrape(proxy)
    families = {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("taotrace")}
    assert set(families) == set(CONTRACT)
    for name, (kind, labels) in CONTRACT.items():
        fam = families[name]
        assert fam.type == kind, name
        for sample in fam.samples:
            assert set(sample.labels) - {"le"} == labels, (name, sample.labels)
    assert "taotrace_requests_total{" in text and "taotrace_tokens_total{" in text
    phases = {s.labels["phase"] for s in families["taotrace_phase_duration_seconds"].samples}
    assert phases == {"network", "prefill_wait", "decode"}


def test_latency_buckets_reach_from_1ms_past_300s() -> None:
    assert BUCKETS_LATENCY[0] == 0.001 and BUCKETS_LATENCY[-1] >= 300


@BOTH_MODES
async def test_exemplars_carry_the_trace_id_in_openmetrics(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    proxy.serve(stream_handler(chat_stream(3)))
    async with client.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
        await r.read()
    trace_id = (await proxy.settled(1))[-1].trace_id
    assert trace_id and len(trace_id) == 32
    ctype, text = await scrape(proxy, "application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert ctype.startswith("application/openmetrics-text")
    ttft_lines = [
        l for l in text.splitlines() if l.startswith("taotrace_time_to_first_token_seconds_bucket") and "#" in l
    ]
    assert ttft_lines and f'trace_id="{trace_id}"' in ttft_lines[0]
    _, plain = await scrape(proxy)
    assert "trace_id" not in plain  # the classic text format has no exemplars


async def test_health_and_readiness(proxy: Proxied) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(proxy.metrics_url + "/healthz") as r:
            assert r.status == 200
        async with s.get(proxy.metrics_url + "/readyz") as r:
            assert r.status == 200
    proxy.srv.requests.draining = True
    async with aiohttp.ClientSession() as s:
        async with s.get(proxy.metrics_url + "/readyz") as r:
            assert r.status == 503
    proxy.srv.requests.draining = False


@BOTH_MODES
async def test_proxy_port_reserves_no_path(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    for path in ("/metrics", "/healthz", "/readyz"):
        async with client.get(proxy.url + path) as r:
            assert r.status == 200
        assert proxy.upstream.seen[-1].path_qs == path


def test_model_labels_first_n_then_other() -> None:
    labels = ModelLabels(limit=3)
    assert [labels(m) for m in ("a", "b", "a", "c", "d", None, "")] == [
        "a",
        "b",
        "a",
        "c",
        "other",
        "unknown",
        "unknown",
    ]
    allow = ModelLabels(allowlist=frozenset({"gpt-4o"}))
    assert (allow("gpt-4o"), allow("x")) == ("gpt-4o", "other")


@BOTH_MODES
async def test_model_label_is_bounded_end_to_end(
    start_proxy, client: aiohttp.ClientSession, registry: CollectorRegistry
) -> None:
    async with start_proxy(max_models=5) as p:
        for i in range(20):
            async with client.post(p.url + "/v1/chat/completions", json={"model": f"made-up-{i}"}) as r:
                await r.read()
        await p.settled(20)  # with workers: the bound holds across the group, not per worker
    models = {s.labels["model"] for m in registry.collect() if m.name == "taotrace_requests" for s in m.samples}
    assert models == {f"made-up-{i}" for i in range(5)} | {"other"}


def _histogram_state(metrics: Iterable[Metric]) -> tuple[list[tuple[str, float]], float]:
    """(bucket samples, sum) of the one histogram collected."""
    (family,) = metrics
    buckets = [(s.labels["le"], s.value) for s in family.samples if s.name.endswith("_bucket")]
    (total,) = [s.value for s in family.samples if s.name.endswith("_sum")]
    return buckets, total


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.floats(min_value=-1.0, max_value=5000.0, allow_nan=False),
            st.sampled_from([*BUCKETS_LATENCY, *BUCKETS_TOKEN, 0.0]),  # exactly on a bound
        ),
        max_size=200,
    ),
    buckets=st.sampled_from([BUCKETS_LATENCY, BUCKETS_TOKEN]),
)
def test_observe_many_equals_histogram_observe(values: list[float], buckets: tuple[float, ...]) -> None:
    # A histogram child's observe_many (the bulk path for inter-token latencies and relay times)
    # must bucket every value exactly as prometheus_client's Histogram.observe does, one by one
    # (the first bound with v <= bound).
    reference_registry = CollectorRegistry()
    reference = Histogram("h", "h", ["api"], buckets=buckets, registry=reference_registry)
    fast = exposition.Histogram("h", "h", ["api"], buckets=buckets)
    for child in (reference.labels("x"), fast.labels("x")):
        child.observe(0.25)  # a histogram that already holds a value
    for v in values:
        reference.labels("x").observe(v)
    fast.labels("x").observe_many(values)
    ref_buckets, ref_sum = _histogram_state(reference_registry.collect())
    fast_buckets, fast_sum = _histogram_state([fast.collect()])
    assert fast_buckets == ref_buckets
    # The sum is added once instead of value by value: equal up to float rounding.
    assert fast_sum == pytest.approx(ref_sum, rel=1e-12, abs=1e-9)


def test_error_types_are_the_documented_vocabulary() -> None:
    # ERROR_TYPES (the allowed `error_type` words, also the GenAI metrics' error.type set) is the
    # table in docs/errors.md, and covers every word the proxy's errors and status mapping produce.
    page = (Path(__file__).resolve().parent.parent / "docs" / "errors.md").read_text()
    table = page.split("\n## ", 1)[0]
    documented = [w for w in re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.M) if w != "error_type"]
    assert sorted(documented) == sorted(ERROR_TYPES)
    produced: set[str] = {cls.error_type for cls in _subclasses(ProxyError)}
    produced |= {error_type_for_status(s, b) for s in range(400, 600) for b in (b"", b"model")}
    assert produced <= set(ERROR_TYPES)


def _subclasses(cls: type[ProxyError]) -> set[type[ProxyError]]:
    return {cls} | {s for sub in cls.__subclasses__() for s in _subclasses(sub)}


def test_the_error_tree_is_drawn_whole() -> None:
    # proxy/errors.py draws its exception tree in the docstring: every class is in it, and every
    # name in it is a class there (a renamed or removed one would leave a stale drawing).
    import proxy.errors

    doc = proxy.errors.__doc__ or ""
    drawn = set(re.findall(r"^\s*(?:[├└]── )?([A-Z][A-Za-z]+)\s{2,}", doc, flags=re.M))
    defined = {
        name
        for name, obj in vars(proxy.errors).items()
        if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == "proxy.errors"
    }
    assert drawn == defined


def test_observe_many_counts_every_value_even_a_nan() -> None:
    # The bulk path walks sorted runs; a NaN (never a real timing) must not stall it or lose a
    # count: every value lands in one bucket, as many counts as values.
    fast = exposition.Histogram("h", "h", ["api"], buckets=BUCKETS_TOKEN)
    values = [0.003, math.nan, 0.001, math.inf, -1.0, math.nan, 0.003, 7.0]
    fast.labels("x").observe_many(values)
    (family,) = [fast.collect()]
    counts = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert counts["+Inf"] == len(values)


def test_the_overhead_carries_the_trace_to_follow() -> None:
    # The dashboard's overhead panels link a slow request stage (or the slowest relay) to its trace.
    metrics = Metrics(CollectorRegistry())
    rec = record_for("chat_completions", "m", 200, random.Random(5))
    relay = (0.00002, 0.0031, 0.00004)
    rec = dataclasses.replace(rec, timing=dataclasses.replace(rec.timing, overhead_request=0.0007, relay=relay))
    metrics.record(rec)
    page = metrics.registry.render(openmetrics=True).decode()
    lines = [
        line for line in page.splitlines() if line.startswith("taotrace_proxy_overhead_seconds_bucket") and "#" in line
    ]
    request = [line for line in lines if 'stage="request"' in line]
    relayed = [line for line in lines if 'stage="relay"' in line]
    assert len(request) == len(relayed) == 1
    assert f'# {{trace_id="{rec.trace_id}"}} 0.0007 ' in request[0] and 'le="0.001"' in request[0]
    assert f'# {{trace_id="{rec.trace_id}"}} 0.0031 ' in relayed[0] and 'le="0.005"' in relayed[0]


def test_the_itl_exemplar_is_the_slowest_gap() -> None:
    # One exemplar per stream on the inter-token histogram: on the slowest gap's bucket, with
    # that gap as its value; every gap is counted once.
    metrics = Metrics(CollectorRegistry())
    rec = record_for("chat_completions", "m", 200, random.Random(3), tokens=40)
    metrics.record(rec)
    page = metrics.registry.render(openmetrics=True).decode()
    lines = [line for line in page.splitlines() if line.startswith("taotrace_inter_token_latency_seconds_bucket")]
    with_exemplar = [line for line in lines if "#" in line]
    assert isinstance(rec.timing.itl, tuple)
    slowest = max(rec.timing.itl)
    assert len(with_exemplar) == 1
    assert f'# {{trace_id="{rec.trace_id}"}} {slowest!r} ' in with_exemplar[0]
    le = float(with_exemplar[0].split('le="')[1].split('"')[0])
    below = [b for b in BUCKETS_TOKEN if b < le]
    assert slowest <= le and (not below or slowest > below[-1])
    assert lines[-1].split("}")[1].split()[0] == f"{len(rec.timing.itl)}.0"  # +Inf: every gap
