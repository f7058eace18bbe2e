"""A long per-token series binned where the request was served (proxy/exchange/series.py,
proxy/workers/binning.py): every histogram and the live view read it as they read its values."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import random
import sys

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.export import HistogramDataPoint
from prometheus_client.parser import text_string_to_metric_families

from proxy.config.settings import Settings
from proxy.exchange.record import RequestRecord
from proxy.exchange.series import MAX_GAPS, Binned, bin_series, compact_gaps
from proxy.telemetry.aggregate import AttributeSet, HistogramInstrument
from proxy.telemetry.exposition import Histogram, Registry
from proxy.telemetry.genai_metrics import BUCKETS_SPEC_SECONDS
from proxy.telemetry.metrics import BUCKETS_OVERHEAD, BUCKETS_TOKEN, Metrics, ModelLabels
from proxy.ui.render import detail
from proxy.ui.ring import Ring
from proxy.workers.binning import BIN_FROM, EDGES, binned
from proxy.workers.channel import decode_frame, encode
from proxy.workers.messages import Records
from tests.fakes import FakeUpstream, chat_chunk, record_for, sse, stream_handler

EDGE_SETS = (BUCKETS_TOKEN, BUCKETS_OVERHEAD, BUCKETS_SPEC_SECONDS)


@st.composite
def _series(draw: st.DrawFn) -> tuple[tuple[float, ...], list[float], Binned]:
    """Buckets, non-negative finite values (some exactly on an edge, where the bucket rule shows)
    and those values binned."""
    edges = draw(st.sampled_from(EDGE_SETS))
    value = st.one_of(st.floats(0, edges[-1] * 2, allow_nan=False), st.sampled_from(edges), st.just(0.0))
    values = draw(st.lists(value, min_size=1, max_size=600))
    binned = bin_series(values, edges)
    assert binned is not None
    return edges, values, binned


@settings(max_examples=150, deadline=None)
@given(series=_series())
def test_a_prometheus_histogram_reads_a_binned_series_as_its_values(
    series: tuple[tuple[float, ...], list[float], Binned],
) -> None:
    edges, values, binned = series
    pages = []
    for given_values in (values, binned):
        registry = Registry()
        child = Histogram("h", "h.", ("k",), buckets=edges, registry=registry).labels("v")
        child.observe_many(given_values, {"trace_id": "ab" * 16})
        pages.append((registry.render(), child.counts, child.sum, {i: e[:2] for i, e in child.exemplars.items()}))
    assert pages[0] == pages[1]  # the same counts, the very same sum, the exemplar on the largest


@settings(max_examples=150, deadline=None)
@given(series=_series())
def test_an_otlp_histogram_reads_a_binned_series_as_its_values(
    series: tuple[tuple[float, ...], list[float], Binned],
) -> None:
    edges, values, binned = series
    points: list[HistogramDataPoint] = []
    for given_values in (values, binned):
        h = HistogramInstrument("h", "s", "h.", edges, clock=lambda: 1)
        h.record_many_set([0.5], AttributeSet.of({"k": "v"}))  # a total to add to
        h.record_many_set(given_values, AttributeSet.of({"k": "v"}))
        collected = h.collect()
        assert collected is not None
        (point,) = collected.data.data_points
        assert isinstance(point, HistogramDataPoint)
        points.append(point)
    raw, from_bins = points
    assert (raw.bucket_counts, raw.count, raw.min, raw.max) == (
        from_bins.bucket_counts,
        from_bins.count,
        from_bins.min,
        from_bins.max,
    )
    assert from_bins.sum == pytest.approx(raw.sum, rel=1e-12)  # added as one number: the last digits may differ


@pytest.mark.parametrize("bad", [-1e-6, math.inf, math.nan])
def test_a_series_with_a_value_no_histogram_takes_is_not_binned(bad: float) -> None:
    assert bin_series([0.001] * 40 + [bad], BUCKETS_TOKEN) is None
    rec = record_for("chat_completions", "m", 200, random.Random(1), tokens=100)
    assert isinstance(rec.timing.itl, tuple)
    odd = dataclasses.replace(rec, timing=dataclasses.replace(rec.timing, itl=(*rec.timing.itl, bad)))
    assert binned(odd).timing.itl == odd.timing.itl  # crosses as it is: each histogram applies its own rule


def test_a_histogram_given_a_series_binned_for_other_buckets_refuses_it() -> None:
    series = bin_series([0.001] * 40, BUCKETS_OVERHEAD)
    assert series is not None
    with pytest.raises(ValueError, match="other buckets"):
        Histogram("h", "h.", buckets=BUCKETS_TOKEN, registry=Registry()).labels().observe_many(series)
    with pytest.raises(ValueError, match="other buckets"):
        HistogramInstrument("h", "s", "h.", BUCKETS_TOKEN).record_many_set(series, AttributeSet.of({}))


def _long_record(seed: int, tokens: int) -> RequestRecord:
    rnd = random.Random(seed)
    rec = record_for("chat_completions", "gpt-4o", 200, rnd, tokens=tokens)
    relay = tuple(rnd.uniform(2e-6, 2e-4) for _ in range(tokens + 2))
    chunk_gaps = tuple(rnd.uniform(0.003, 0.03) for _ in range(tokens))
    return dataclasses.replace(rec, timing=dataclasses.replace(rec.timing, relay=relay, chunk_gaps=chunk_gaps))


@pytest.mark.parametrize("tokens", [BIN_FROM - 3, BIN_FROM, BIN_FROM + 1, MAX_GAPS + 1, 3 * MAX_GAPS + 5])
def test_a_record_through_the_channel_gives_the_same_metrics_and_live_view(tokens: int) -> None:
    """A worker's record, long series binned on the way, against the record as one process has it."""
    rec = _long_record(tokens, tokens)
    message = decode_frame(encode(Records([binned(rec)], {}, 0, {}, {})))
    assert isinstance(message, Records)
    (back,) = message.records
    for name in EDGES:
        assert isinstance(getattr(back.timing, name), Binned) == (len(getattr(rec.timing, name)) >= BIN_FROM)
        assert len(getattr(back.timing, name)) == len(getattr(rec.timing, name))
    pages, views = [], []
    for r in (rec, back):
        metrics = Metrics(models=ModelLabels())
        metrics.record(r)
        pages.append(metrics.registry.render())
        views.append(detail(Ring(10).add(r, 1.7e9)))
    assert pages[0] == pages[1]
    assert views[0]["gaps"] == views[1]["gaps"]
    assert views[0]["record"] == views[1]["record"]


def test_the_live_views_bars_of_a_long_stream_are_its_largest_gaps() -> None:
    gaps = tuple(random.Random(4).uniform(0.001, 0.01) for _ in range(1000))
    series = bin_series(gaps, BUCKETS_TOKEN, keep=True)
    assert series is not None
    assert (series.bars(), series.per_bar) == compact_gaps(gaps, MAX_GAPS)
    assert max(series.bars()) == max(gaps) == series.high


@pytest.mark.skipif(sys.platform != "linux", reason="--workers needs SO_REUSEPORT (Linux)")
@pytest.mark.parametrize("group", ["workers", "telemetry_process"])
async def test_a_long_stream_served_by_a_worker_is_counted_whole_by_the_supervisor(
    upstream: FakeUpstream, client: aiohttp.ClientSession, group: str
) -> None:
    """Two workers bin a long stream's series; one worker with a telemetry process (whose
    supervisor has CPU to spare) ships them as they are: the same counts and bars either way."""
    from proxy.workers.supervisor import supervising

    tokens = 300
    upstream.handler = stream_handler(sse(*(chat_chunk(f"t{i}") for i in range(tokens))), gap=0.0005)
    seen: list[RequestRecord] = []
    mode = {"workers": 2} if group == "workers" else {"telemetry_process": True}
    settings_ = Settings(upstream=upstream.url, port=0, metrics_port=0, **mode)
    async with supervising(settings_, env=os.environ, on_record=seen.append) as running:
        async with client.post(running.proxy_url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
            body = await r.read()
        assert body.count(b"data: {") == tokens
        for _ in range(200):  # the worker ships its records in batches
            if seen:
                break
            await asyncio.sleep(0.05)
        async with client.get(running.metrics_url + "/api/requests") as r:
            (row,) = (await r.json())["requests"]
        async with client.get(running.metrics_url + "/api/requests/" + row["id"]) as r:
            shown = await r.json()
        async with client.get(running.metrics_url + "/metrics") as r:
            prom = await r.text()
    (rec,) = seen
    assert isinstance(rec.timing.itl, Binned) == (group == "workers") and len(rec.timing.itl) == tokens - 1
    counts = [
        s.value
        for family in text_string_to_metric_families(prom)
        for s in family.samples
        if s.name == "taotrace_inter_token_latency_seconds_count"
    ]
    assert counts == [tokens - 1]
    gaps = shown["gaps"]  # 299 gaps, more than the view's MAX_GAPS bars: the largest of each two
    assert (gaps["count"], gaps["per_bar"], len(gaps["values"])) == (tokens - 1, 2, 150)
