"""Our exposition against prometheus_client's own, for the same observations, and against the
parsers that will read it: prometheus_client's text and OpenMetrics parsers, and promtool."""

from __future__ import annotations

import asyncio
import random
import re
import shutil
import subprocess
from collections.abc import Callable

import prometheus_client as pc
import pytest
from prometheus_client.openmetrics.exposition import generate_latest as pc_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from proxy.server.app import create_metrics_app
from proxy.telemetry import exposition as ex
from proxy.telemetry.exposition import wants_openmetrics
from proxy.telemetry.metrics import BUCKETS_LATENCY, BUCKETS_TOKEN, Metrics
from tests.fakes import record_for

# Label values a client can put in a model name: quotes, backslashes, a newline, `%`, non-ASCII.
MODELS = ("gpt-4o-mini", 'a"quoted"', "back\\slash", "new\nline", "100%s%d", "模型-ü")


@pytest.fixture(autouse=True)
def _no_created() -> None:
    pc.disable_created_metrics()  # we write no `_created` series; compare like with like


def _pair() -> tuple[ex.Registry, pc.CollectorRegistry, Callable[[str, tuple[str, ...], float, str | None], None]]:
    """The same families on our registry and on a prometheus_client one, and one way to feed both."""
    ours, theirs = ex.Registry(), pc.CollectorRegistry()
    kinds = {
        "t_requests": (ex.Counter, pc.Counter, ("api", "model", "status_code")),
        "t_in_flight": (ex.Gauge, pc.Gauge, ("api",)),
        "t_latency_seconds": (ex.Histogram, pc.Histogram, ("api", "model")),
        "t_token_seconds": (ex.Histogram, pc.Histogram, ("model", "phase")),
    }
    fams = {}
    for name, (mine, lib, labels) in kinds.items():
        kw = {"buckets": BUCKETS_LATENCY if "latency" in name else BUCKETS_TOKEN} if mine is ex.Histogram else {}
        doc = f"Help of {name}, with a \\ backslash."
        fams[name] = (mine(name, doc, labels, registry=ours, **kw), lib(name, doc, labels, registry=theirs, **kw))

    def feed(name: str, labels: tuple[str, ...], value: float, trace_id: str | None) -> None:
        a, b = fams[name]
        if name == "t_requests":
            a.labels(*labels).inc(value)
            b.labels(*labels).inc(value)
        elif name == "t_in_flight":
            a.labels(*labels).set(value)
            b.labels(*labels).set(value)
        else:
            exemplar = {"trace_id": trace_id} if trace_id else None
            a.labels(*labels).observe(value, exemplar)
            b.labels(*labels).observe(value, exemplar)

    return ours, theirs, feed


def _random_traffic(feed: Callable[[str, tuple[str, ...], float, str | None], None], n: int, seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(n):
        model = rnd.choice(MODELS)
        trace = f"{rnd.getrandbits(128):032x}" if rnd.random() < 0.7 else None
        feed("t_requests", ("chat", model, rnd.choice(("200", "429"))), rnd.choice((1, 3, 0.5)), None)
        feed("t_in_flight", (rnd.choice(("chat", "messages")),), rnd.randint(-2, 50), None)
        feed("t_latency_seconds", ("chat", model), rnd.lognormvariate(-1, 2), trace)
        # exact bucket bounds, zero and +Inf land where prometheus_client puts them
        feed("t_token_seconds", (model, "decode"), rnd.choice((*BUCKETS_TOKEN, 0.0, 1e9, rnd.random())), trace)


EXEMPLAR_TIME = re.compile(rb'(# \{trace_id="[0-9a-f]{32}"\} \S+) \d+\.\d+')


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_text_format_is_byte_identical_to_prometheus_client(seed: int) -> None:
    ours, theirs, feed = _pair()
    _random_traffic(feed, 400, seed)
    assert ours.render() == pc.generate_latest(theirs)


@pytest.mark.parametrize("seed", [1, 2])
def test_openmetrics_with_exemplars_is_identical_but_for_exemplar_times(seed: int) -> None:
    ours, theirs, feed = _pair()
    _random_traffic(feed, 400, seed)
    mine = ours.render(openmetrics=True)
    assert b"# {trace_id=" in mine and mine.endswith(b"# EOF\n")
    # The exemplar's timestamp is the wall clock at observe(): each library took its own.
    assert EXEMPLAR_TIME.sub(rb"\1", mine) == EXEMPLAR_TIME.sub(rb"\1", pc_openmetrics(theirs))
    families = {f.name: f for f in parse_openmetrics(mine.decode())}  # the strict OpenMetrics parser
    assert set(families) == {"t_requests", "t_in_flight", "t_latency_seconds", "t_token_seconds"}


def test_the_page_follows_new_observations_after_a_cached_render() -> None:
    ours, theirs, feed = _pair()
    _random_traffic(feed, 50, 7)
    assert ours.render() == pc.generate_latest(theirs)
    ours.render(openmetrics=True)
    _random_traffic(feed, 50, 8)
    assert ours.render() == pc.generate_latest(theirs)
    assert EXEMPLAR_TIME.sub(rb"\1", ours.render(True)) == EXEMPLAR_TIME.sub(rb"\1", pc_openmetrics(theirs))


def test_a_change_in_any_group_shows_on_the_next_render() -> None:
    """Children are rendered in groups, and an unchanged group's piece is reused: a change to
    any one child, in the first, a middle or the last group, or a new child, is on the next page."""
    ours, theirs, feed = _pair()
    models = [f"m{i}" for i in range(3 * ex.GROUP_SIZE + 5)]  # four groups per family
    for i, model in enumerate(models):
        feed("t_requests", ("chat", model, "200"), 1, None)
        feed("t_latency_seconds", ("chat", model), i / 100, f"{i:032x}")
    assert len(ours.families[0].groups) == 4
    assert ours.render() == pc.generate_latest(theirs)
    first = list(ours.pages(openmetrics=True))
    for model in (models[0], models[ex.GROUP_SIZE + 3], models[-1], "new-model"):
        feed("t_requests", ("chat", model, "200"), 2, None)
        feed("t_latency_seconds", ("chat", model), 0.25, "f" * 32)
        assert ours.render() == pc.generate_latest(theirs), model
        mine = ours.render(openmetrics=True)
        assert EXEMPLAR_TIME.sub(rb"\1", mine) == EXEMPLAR_TIME.sub(rb"\1", pc_openmetrics(theirs)), model
    again = list(ours.pages(openmetrics=True))
    # the groups no change touched are the very same bytes objects as before: nothing re-rendered
    kept = sum(a is b for a, b in zip(first, again, strict=False))
    assert kept >= len(first) - 2 * 4 - 1, (kept, len(first))


async def test_a_page_rendered_in_slices_while_requests_are_recorded() -> None:
    """The scrape renders on the event loop and gives it back between slices: requests recorded
    in between land in this page or the next, every series stays whole, and nothing is lost."""
    from proxy.server.app import render_page

    ours, theirs, feed = _pair()
    _random_traffic(feed, 300, 3)
    ticks = iter(range(10**9))
    rendering = asyncio.ensure_future(render_page(ours.pages, True, clock=lambda: float(next(ticks))))
    while not rendering.done():  # a slice per piece (the clock passes every deadline)
        _random_traffic(feed, 1, 4)
        await asyncio.sleep(0)
    page = b"".join(rendering.result()).decode()
    assert page.endswith("# EOF\n")
    list(parse_openmetrics(page))  # the strict parser: every histogram's buckets, count and sum agree
    assert ours.render() == pc.generate_latest(theirs)


def test_counter_and_gauge_lines_follow_every_change_between_renders() -> None:
    """A counter's or gauge's line is kept from one render to the next while its value stays:
    every change (even one to an equal-looking float, -0.0 after 0.0) is written anew."""
    ours, theirs = ex.Registry(), pc.CollectorRegistry()
    gauges = ex.Gauge("t_g", "g", ("k",), registry=ours), pc.Gauge("t_g", "g", ("k",), registry=theirs)
    counters = ex.Counter("t_c", "c", ("k",), registry=ours), pc.Counter("t_c", "c", ("k",), registry=theirs)
    steps: list[Callable[[ex.Gauge | pc.Gauge, ex.Counter | pc.Counter], object]] = [
        lambda g, c: (g.labels("a").set(3), c.labels("a").inc(2)),
        lambda g, c: g.labels("a").set(3.0),
        lambda g, c: (g.labels("a").set(0.0), c.labels("a").inc(0)),
        lambda g, c: (g.labels("a").set(-0.0), c.labels("b").inc(1)),
        lambda g, c: (g.labels("a").dec(1.5), c.labels("a").inc(0.25)),
    ]
    for step in steps:
        step(gauges[0], counters[0])
        step(gauges[1], counters[1])
        assert ours.render() == pc.generate_latest(theirs)
        assert ours.render(openmetrics=True) == pc_openmetrics(theirs)


def test_counts_past_a_million_are_written_as_prometheus_client_writes_them() -> None:
    ours = ex.Registry()
    h = ex.Histogram("big_seconds", "Big.", ("a",), buckets=(0.1, 1.0), registry=ours)
    h.labels("x").observe_many([0.05] * 1_200_000)
    h.labels("x").observe(0.5, {"trace_id": "0" * 32})
    c = ex.Counter("big", "Big.", registry=ours)
    c.labels().inc(12_345_678)
    text = ours.render().decode()
    assert 'big_seconds_bucket{a="x",le="0.1"} 1.2e+06\n' in text
    assert 'big_seconds_count{a="x"} 1.200001e+06\n' in text
    assert "big_total 1.2345678e+07\n" in text
    samples = {(s.name, s.labels.get("le")): s.value for f in parse_text(text) for s in f.samples}
    assert samples[("big_seconds_bucket", "1.0")] == 1_200_001
    om = ours.render(openmetrics=True).decode()
    assert 'le="1.0"} 1.200001e+06 # {trace_id="' in om
    list(parse_openmetrics(om))


def test_metrics_families_render_as_collected() -> None:
    """Every family of `Metrics` is on the fast page, and a CollectorRegistry sees the same ones
    (a family registered straight into prometheus_client would be missing from /metrics)."""
    registry = pc.CollectorRegistry()
    metrics = Metrics(registry)
    for family in metrics.registry.families:  # a child in each, so every family has samples
        labels = ["x"] * len(family.labelnames)
        child = family.labels(*labels)
        child.observe(0.1) if isinstance(family, ex.Histogram) else child.inc()  # type: ignore[attr-defined]
    page = {f.name for f in parse_text(metrics.registry.render().decode())}
    assert page == {m.name for m in registry.collect()}
    assert {"taotrace_requests", "taotrace_time_to_first_token_seconds", "taotrace_in_flight_requests"} <= page


def test_accept_header_negotiation() -> None:
    prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    assert wants_openmetrics(prometheus)
    assert not wants_openmetrics("")
    assert not wants_openmetrics("text/plain; version=0.0.4")
    assert not wants_openmetrics("*/*")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (make system-deps)")
def test_promtool_accepts_a_full_page_of_the_proxys_metrics() -> None:
    metrics = Metrics(None)
    _fill(metrics, models=20)
    page = metrics.registry.render()
    proc = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def _fill(metrics: Metrics, models: int) -> None:
    """A request of every outcome for each api x model, so every child exists."""
    rnd = random.Random(0)
    for api in ("chat_completions", "completions", "responses", "messages", "other"):
        for k in range(models):
            for status in (200, 429):
                metrics.record(record_for(api, f"model-{k}", status, rnd))


async def test_metrics_port_serves_both_formats(aiohttp_client) -> None:
    metrics = Metrics(None)
    _fill(metrics, models=2)
    client = await aiohttp_client(create_metrics_app(metrics.registry.pages, lambda: "ready"))
    r = await client.get("/metrics")
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert {f.name for f in parse_text(await r.text())} >= {"taotrace_requests", "taotrace_tokens"}
    r = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    body = await r.text()
    assert '# {trace_id="' in body and body.endswith("# EOF\n")
    list(parse_openmetrics(body))


def test_labels_finds_one_child_however_the_values_are_given() -> None:
    # `labels()` looks the given values up as they are before it converts them to strings: a
    # number, its string and the named form must still reach the same child, and a wrong count
    # is still refused.
    counter = ex.Counter("c", "c", ("api", "status_code"))
    first = counter.labels("chat", "200")
    assert counter.labels("chat", 200) is first
    assert counter.labels(api="chat", status_code=200) is first
    assert counter.labels("chat", "200") is first
    assert len(counter.children) == 1
    with pytest.raises(ValueError, match="expected labels"):
        counter.labels("chat")


def test_a_histogram_observed_between_two_renders_shows_the_new_counts() -> None:
    # Each histogram child keeps its rendered lines while it is unchanged: every kind of
    # observation (one value, many, with and without an exemplar) must drop them.
    ours, theirs, feed = _pair()
    _random_traffic(feed, 50, seed=4)
    for step in range(6):
        assert ours.render() == pc.generate_latest(theirs)
        first = ours.render(openmetrics=True)
        assert EXEMPLAR_TIME.sub(rb"\1", first) == EXEMPLAR_TIME.sub(rb"\1", pc_openmetrics(theirs))
        trace = f"{step + 1:032x}" if step % 2 else None
        feed("t_latency_seconds", ("chat", MODELS[step]), 0.3 * step, trace)
        after = ours.render(openmetrics=True)
        assert after != first
        assert EXEMPLAR_TIME.sub(rb"\1", after) == EXEMPLAR_TIME.sub(rb"\1", pc_openmetrics(theirs))
    registry = ex.Registry()
    child = ex.Histogram("h", "h", ("m",), buckets=(0.1, 1.0), registry=registry).labels("a")
    assert b'h_count{m="a"} 0.0' in registry.render()
    child.observe_many([0.05, 0.5, 5.0])  # a stream's gaps, all at once
    assert b'h_count{m="a"} 3.0' in registry.render()
    assert b'h_bucket{le="1.0",m="a"} 2.0' in registry.render(openmetrics=True)
    child.observe_many([0.7], {"trace_id": "ab" * 16})
    assert b'h_bucket{le="1.0",m="a"} 3.0 # {trace_id="' + b"ab" * 16 in registry.render(openmetrics=True)
