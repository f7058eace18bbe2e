"""The live view's pure parts: the ring, its filters, the 15-minute window, the JSON shapes."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pytest

from proxy.dialects import Usage
from proxy.errors import ErrorType
from proxy.exchange.inflight import InFlight
from proxy.exchange.record import RequestRecord
from proxy.exchange.timing import PhaseClock
from proxy.ui.live import LiveView
from proxy.ui.pairs import Pairs, differences
from proxy.ui.render import detail, row
from proxy.ui.ring import Entry, Query, Ring, compact_gaps, distinct, parse_query, select
from proxy.ui.running import running_detail, running_matches, running_row
from proxy.ui.summary import BUCKET_WIDTH, EXACT_SAMPLES, MAX_MODELS, Window
from proxy.upstream.tcpinfo import TcpStats


def record(
    *,
    model: str | None = "m",
    api: str = "chat_completions",
    ttft: float | None = 0.1,
    tokens: int = 5,
    gap: float = 0.01,
    error_type: ErrorType | Literal[""] = "",
    trace_id: str | None = "ab" * 16,
    network: float = 0.002,
) -> RequestRecord:
    """A request timed by the real PhaseClock: network, then ttft, then `tokens` tokens `gap` apart."""
    clock = PhaseClock(100.0)
    clock.sent(100.0 + network)
    clock.headers(100.0 + network)
    if ttft is not None:
        for i in range(tokens):
            clock.chunk(100.0 + ttft + i * gap)
            clock.token(100.0 + ttft + i * gap)
    end = 100.0 + (ttft or 0.05) + tokens * gap
    timing = clock.finish(end, tokens if ttft is not None else None, streaming=ttft is not None)
    return RequestRecord(
        trace_id=trace_id, api=api, operation="chat", model=model, response_model=model, stream=ttft is not None,
        method="POST", path="/v1/chat/completions", status_code=200 if not error_type else 502, error_type=error_type,
        timing=timing, usage=Usage(10, tokens, 4, None), usage_source="reported", finish_reasons=("stop",),
        response_id="r1", attributes=(("user.id", "alice"),),
    )  # fmt: skip


def test_ring_keeps_the_newest_and_finds_by_trace_id_or_seq() -> None:
    ring = Ring(3)
    for i in range(5):
        ring.add(record(trace_id=f"{i:032x}"), now=1000.0 + i)
    assert [e.seq for e in ring.snapshot()] == [3, 4, 5]
    assert ring.find(f"{4:032x}") is not None and ring.find(f"{0:032x}") is None  # evicted
    untraced = ring.add(record(trace_id=None), now=2000.0)
    assert untraced.id == "6" and ring.find("6") is untraced


def test_long_streams_keep_their_largest_gaps() -> None:
    itl = tuple([0.01] * 999 + [2.5] + [0.01] * 500)  # one stall mid-decode
    gaps, k = compact_gaps(itl, 256)
    assert k == 6 and len(gaps) <= 256 and max(gaps) == 2.5
    assert compact_gaps((0.1, 0.2), 256) == ((0.1, 0.2), 1)
    ring = Ring(10)
    entry = ring.add(record(tokens=1500), now=1.0)
    assert len(entry.record.timing.itl) <= 256 and entry.gaps_per_bar == 6
    assert entry.record.timing.chunk_gaps == ()  # not shown, so not kept once long
    assert entry.record.timing.decode == pytest.approx(1499 * 0.01)  # everything else untouched


def test_a_long_streams_kept_record_differs_only_in_its_long_series() -> None:
    rec = record(tokens=400)
    entry = Ring(10).add(rec, now=1.0)
    kept = entry.record
    assert kept is not rec and kept.timing is not rec.timing
    # every other field the very object the record held; the long series compacted or emptied
    expected = replace(rec, timing=replace(rec.timing, itl=kept.timing.itl, chunk_gaps=(), relay=()))
    assert kept == expected and len(kept.timing.itl) <= 256 and entry.gaps_per_bar == 2
    assert [getattr(kept, f) is getattr(rec, f) for f in ("usage", "attributes", "finish_reasons")] == [True] * 3


def test_select_filters_and_pages_newest_first() -> None:
    ring = Ring(100)
    ring.add(record(model="a"), 1.0)
    ring.add(record(model="b", api="messages"), 2.0)
    ring.add(record(model="a", error_type="timeout"), 3.0)
    ring.add(record(model="a", ttft=2.0), 4.0)
    ring.add(record(model="a", ttft=None), 5.0)  # non-streaming: slow compares the duration
    entries = ring.snapshot()
    assert [e.seq for e in select(entries, Query())] == [5, 4, 3, 2, 1]
    assert [e.seq for e in select(entries, Query(api="messages"))] == [2]
    assert [e.seq for e in select(entries, Query(model="a", limit=2))] == [5, 4]
    assert [e.seq for e in select(entries, Query(errors=True))] == [3]
    assert [e.seq for e in select(entries, Query(slow=1.0))] == [4]
    assert [e.seq for e in select(entries, Query(since=3))] == [5, 4]


@pytest.mark.parametrize(
    "params,message",
    [
        ({"limit": "x"}, "limit must be a number"),
        ({"limit": "0"}, "limit must be between 1 and 50"),
        ({"limit": "51"}, "limit must be between 1 and 50"),
        ({"slow": "nan"}, "slow must be between"),
        ({"errors": "maybe"}, "errors must be true or false"),
        ({"since": "-1"}, "since must be between"),
        ({"order": "asc"}, "unknown parameter 'order'"),
    ],
)
def test_bad_queries_are_refused_with_a_reason(params: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_query(params, capacity=50)


def test_parse_query_defaults_and_values() -> None:
    assert parse_query({}, capacity=50) == Query(limit=50)
    q = parse_query({"limit": "7", "api": "messages", "errors": "1", "slow": "0.5", "since": "3"}, capacity=50)
    assert q == Query(limit=7, api="messages", model=None, errors=True, slow=0.5, since=3)


def test_window_percentiles_are_within_the_bucket_width() -> None:
    window = Window()
    values = [0.01 * (i + 1) for i in range(200)]  # TTFT 10 ms .. 2 s
    for v in values:
        window.add(record(ttft=v, model="m"), now=1000.0)
    snap = window.snapshot(now=1010.0)
    exact = sorted(values)
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        want = exact[math.ceil(q * len(exact)) - 1]
        got = snap["models"]["m"]["ttft"][name]
        assert got == pytest.approx(want, rel=0.05), name
    assert snap["series"]["m"]["ttft"]["p50"] == [snap["models"]["m"]["ttft"]["p50"]]
    assert snap["models"]["m"]["tpot"]["p50"] == pytest.approx(0.01, rel=0.05)
    assert snap["requests"] == 200


def test_window_forgets_after_15_minutes_and_counts_errors_phases_and_rate() -> None:
    window = Window()
    window.add(record(error_type="timeout"), now=0.0)
    for _ in range(30):
        window.add(record(), now=1000.0)
    window.add(record(ttft=None), now=1010.0)
    snap = window.snapshot(now=1015.0)
    assert snap["requests"] == 31 and snap["errors"] == {}  # the t=0 bucket is older than 15 minutes
    assert snap["requests_per_s"] == [pytest.approx(31 / 25)]  # the current bucket began at 990 s: 25 s so far
    phases = snap["phases"]
    assert phases["network"] == pytest.approx(31 * 0.002)
    assert phases["prefill_wait"] == pytest.approx(30 * (0.1 - 0.002))
    assert phases["decode"] == pytest.approx(30 * 4 * 0.01)
    assert phases["tail"] == pytest.approx(30 * 0.01)
    assert phases["response"] == pytest.approx(0.05 + 5 * 0.01 - 0.002)
    window.add(record(error_type="timeout"), now=1016.0)
    assert window.snapshot(now=1016.0)["errors"] == {"timeout": 1}


def test_window_prepares_closed_buckets_a_few_at_a_time() -> None:
    window = Window()
    for minute in range(10):
        window.add(record(), now=minute * 60.0)
    before = window.snapshot(now=600.0)
    window = Window()
    for minute in range(10):
        window.add(record(), now=minute * 60.0)
    assert [window.prepare(now=600.0, limit=4) for _ in range(3)] == [False, False, True]
    assert window.snapshot(now=600.0) == before  # the same answer, computed in slices


def test_window_caps_invented_model_names() -> None:
    window = Window(max_models=3)
    for i in range(50):
        window.add(record(model=f"invented-{i}"), now=10.0)
    models = window.snapshot(now=11.0)["models"]
    assert len(models) == 4 and models["other"]["requests"] == 47


def _running(model: str | None) -> InFlight:
    return InFlight(
        id="r1", trace_id=None, api="other", operation=None, model=model, method="GET", stream=False, upstream="",
        started=1.0, elapsed=0.5, phase="headers", status=None, network=0.001, time_to_headers=None, ttfb=None,
        ttft=None, last_token=None, last_byte=None, output_tokens=0,
    )  # fmt: skip


def test_a_request_without_a_model_is_unknown_everywhere_as_the_metrics_label_it() -> None:
    from proxy.telemetry.metrics import ModelLabels

    assert ModelLabels()(None) == ModelLabels()("") == "unknown"  # the metrics' label, which the API agrees with
    ring = Ring(10)
    ring.add(record(model="a"), 1.0)
    nameless = ring.add(record(model=None, trace_id=None), 2.0)
    ring.add(replace(record(trace_id=None), model=""), 3.0)  # an empty name: no name, as the metrics read it
    entries = ring.snapshot()
    assert row(nameless)["model"] == "unknown"
    assert detail(nameless)["record"]["model"] == "unknown"
    assert detail(nameless, capture_content=True)["record"]["model"] == "unknown"
    assert distinct(entries) == (["chat_completions"], ["a", "unknown"])  # the filter menu offers it
    assert [e.seq for e in select(entries, Query(model="unknown"))] == [3, 2]
    assert [e.seq for e in select(entries, Query(model="a"))] == [1]
    window = Window()
    for e in entries:
        window.add(e.record, now=10.0)
    assert set(window.snapshot(now=11.0)["models"]) == {"a", "unknown"}
    # A request still running, as /api/requests and /api/requests/{id} answer it.
    running = _running(None)
    assert running_row(running)["model"] == "unknown" and running_detail(running)["record"]["model"] == "unknown"
    assert running_matches(running, Query(model="unknown")) and not running_matches(running, Query(model="a"))
    assert running_row(_running("gpt-4o"))["model"] == "gpt-4o"
    assert running_matches(_running("gpt-4o"), Query(model="gpt-4o"))


def test_the_prefill_wait_bar_carries_its_network_round_trip() -> None:
    tcp = TcpStats(rtt=0.03, rtt_var=0.002, min_rtt=0.02, retransmits=0, out_of_order=0, delivery_rate=None)
    rec = replace(record(ttft=0.5), tcp=tcp)
    prefill = {s["name"]: s for s in detail(Entry(seq=1, time=1.0, record=rec))["spans"]}["prefill_wait"]
    assert prefill["rtt"] == 0.02  # min_rtt: the round trip server_wait takes off
    assert prefill["server_wait"] == pytest.approx(rec.timing.prefill_wait - 0.02)
    without = {s["name"]: s for s in detail(Entry(seq=2, time=1.0, record=record()))["spans"]}["prefill_wait"]
    assert "rtt" not in without and "server_wait" not in without  # no TCP_INFO (not Linux): nothing drawn


def test_rows_and_details_carry_the_records_numbers() -> None:
    rec = record(tokens=4)
    entry = Entry(seq=1, time=1234.5, record=rec)
    r = row(entry)
    assert (r["id"], r["ttft"], r["tpot"], r["network"], r["output_tokens"]) == (
        rec.trace_id,
        rec.timing.ttft,
        rec.timing.tpot,
        rec.timing.network,
        4,
    )
    # The instants a row carries: the host's monotonic clock, comparable across processes.
    assert r["first_token_monotonic"] == rec.timing.first_token == pytest.approx(100.1)
    assert r["last_token_monotonic"] == rec.timing.last_token == pytest.approx(100.13)
    untimed = row(Entry(seq=2, time=1.0, record=record(ttft=None)))
    assert untimed["first_token_monotonic"] is None and untimed["last_token_monotonic"] is None
    d = detail(entry, trace_url="http://jaeger:16686/trace/{trace_id}")
    assert d["trace_url"] == f"http://jaeger:16686/trace/{rec.trace_id}"
    spans = {s["name"]: s for s in d["spans"]}
    assert set(spans) == {"chat m", "network", "prefill_wait", "decode"}
    assert spans["prefill_wait"]["end"] - spans["prefill_wait"]["start"] == pytest.approx(rec.timing.prefill_wait)
    assert spans["decode"]["end"] - spans["decode"]["start"] == pytest.approx(rec.timing.decode)
    assert isinstance(rec.timing.itl, tuple)  # one process: the values themselves
    assert d["gaps"] == {"values": list(rec.timing.itl), "per_bar": 1, "count": 3}
    assert d["record"]["usage"]["cached_input_tokens"] == 4 and "itl" not in d["record"]["timing"]
    assert "start" not in d["record"]["timing"]  # monotonic instants mean nothing to a reader
    assert d["record"]["attributes"] == {"user.id": "alice"}  # (name, value) pairs read as a mapping
    assert (
        detail(Entry(seq=2, time=1.0, record=replace(rec, sampling="dropped")), trace_url="http://j/{trace_id}")[
            "trace_url"
        ]
        is None
    )  # a dropped trace is not in the viewer
    assert "chunk_gaps" not in d["record"]["timing"] and d["record"]["timing"]["ttfc"] == pytest.approx(0.1)


def test_few_samples_give_exact_percentiles() -> None:
    window = Window()
    one = record(ttft=0.386, model="gpt-4o")
    window.add(one, now=1000.0)  # one request: its own TTFT, not its bucket's middle (404.4 ms)
    ttft = window.snapshot(now=1001.0)["models"]["gpt-4o"]["ttft"]
    assert ttft == dict.fromkeys(("p50", "p95", "p99"), one.timing.ttft)
    three = [record(ttft=v, model="three") for v in (0.3, 0.1, 0.2)]
    for rec in three:
        window.add(rec, now=1000.0)
    low, mid, high = sorted(r.timing.ttft for r in three if r.timing.ttft is not None)
    assert window.snapshot(now=1001.0)["models"]["three"]["ttft"] == {"p50": mid, "p95": high, "p99": high}
    # Across buckets too (the 15-minute figures merge them).
    later = record(ttft=0.25, model="three")
    window.add(later, now=1040.0)
    snap = window.snapshot(now=1041.0)
    assert snap["models"]["three"]["ttft"]["p50"] == mid  # nearest rank of 4: the 2nd
    assert snap["series"]["three"]["ttft"]["p50"] == [mid, later.timing.ttft]


def test_many_samples_stay_within_the_exact_min_and_max() -> None:
    window = Window()
    same = record(ttft=0.386, model="m")
    for _ in range(EXACT_SAMPLES + 10):
        window.add(same, now=1000.0)  # all equal: the bucket's middle alone would say 404.4 ms
    ttft = window.snapshot(now=1001.0)["models"]["m"]["ttft"]
    assert ttft == dict.fromkeys(("p50", "p95", "p99"), same.timing.ttft)


def _half(pair_id: str, *, mirror: bool, upstream: str, **kw: object) -> RequestRecord:
    return replace(record(**kw), pair_id=pair_id, mirror=mirror, upstream=upstream)  # type: ignore[arg-type]


def test_a_pairs_differences_are_mirror_minus_request() -> None:
    tcp = TcpStats(rtt=0.03, rtt_var=0.002, min_rtt=0.02, retransmits=0, out_of_order=0, delivery_rate=None)
    request = replace(_half("p1", mirror=False, upstream="a", ttft=0.1, gap=0.01, tokens=5), tcp=tcp)
    mirror = _half("p1", mirror=True, upstream="b", ttft=0.4, gap=0.03, tokens=7, error_type="stream_cut")
    d = differences(request, mirror)
    assert d["ttft"] == pytest.approx(0.3) and d["tpot"] == pytest.approx(0.02)
    assert d["duration"] == pytest.approx(mirror.timing.duration - request.timing.duration)
    assert d["output_tokens"] == 2
    assert d["rtt"] is None  # only one side has TCP_INFO: no difference invented
    assert d["outcome"] == {"request": "ok", "mirror": "stream_cut"}


def test_pairs_match_either_order_and_summarise_per_route_pair() -> None:
    pairs = Pairs(window_s=900.0)
    # Two pairs where the mirror is slower, one where it is faster, one where the mirror failed.
    for i, (request_ttft, mirror_ttft) in enumerate(((0.1, 0.4), (0.1, 0.3), (0.3, 0.2))):
        halves = [
            _half(f"p{i}", mirror=False, upstream="a", ttft=request_ttft),
            _half(f"p{i}", mirror=True, upstream="b", ttft=mirror_ttft),
        ]
        if i == 1:
            halves.reverse()  # the copy may end before the request
        for half in halves:
            pairs.add(half, now=1000.0)
    pairs.add(_half("x", mirror=False, upstream="a"), now=1000.0)
    pairs.add(_half("x", mirror=True, upstream="b", error_type="connect", ttft=None), now=1000.0)
    pairs.add(_half("lonely", mirror=False, upstream="a"), now=1000.0)  # its copy never came back
    pairs.add(record(), now=1000.0)  # not paired: ignored
    (group,) = pairs.snapshot(now=1001.0)
    assert (group["upstream"], group["mirror"], group["pairs"], group["both_ok"]) == ("a", "b", 4, 3)
    assert (group["request_errors"], group["mirror_errors"]) == (0, 1)
    assert group["ttft_difference_p50"] == pytest.approx(0.2)  # median of +0.3, +0.2, −0.1
    assert group["tpot_difference_p50"] == pytest.approx(0.0)
    assert (group["mirror_first"], group["compared"]) == (1, 3)
    assert pairs.snapshot(now=1000.0 + 901.0) == []  # 15 minutes on, forgotten


def test_waiting_halves_are_bounded() -> None:
    pairs = Pairs(max_pending=2)
    for i in range(3):
        pairs.add(_half(f"p{i}", mirror=False, upstream="a"), now=1.0)
    pairs.add(_half("p0", mirror=True, upstream="b"), now=1.0)  # its request was forgotten first
    pairs.add(_half("p2", mirror=True, upstream="b"), now=1.0)
    assert [g["pairs"] for g in pairs.snapshot(now=2.0)] == [1]


def test_mirror_copies_stay_out_of_the_request_statistics() -> None:
    live = LiveView(clock=lambda: 1000.0)
    live.observe(_half("p1", mirror=False, upstream="a", ttft=0.1))
    live.observe(_half("p1", mirror=True, upstream="b", ttft=0.5, error_type="rate_limited"))
    live.observe(record(ttft=0.2))
    summary = live.window.snapshot(1001.0)
    assert summary["requests"] == 2 and summary["errors"] == {}  # the copy's 429 is not the clients'
    assert summary["models"]["m"]["ttft"]["p99"] == pytest.approx(0.2)
    assert len(live.ring) == 3  # the list shows the copy, marked
    request, mirror = live.ring.find_pair("p1")
    assert request is not None and mirror is not None and mirror.record.mirror and not request.record.mirror
    assert live.ring.find_pair("nope") == (None, None)
    assert live.pairs.snapshot(1001.0)[0]["mirror_errors"] == 1


ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_and_the_page_state_the_histograms_the_code_uses() -> None:
    width = f"{BUCKET_WIDTH * 100:g} % wide"
    within = f"±{BUCKET_WIDTH * 50:g} %"
    exact = f"at most {EXACT_SAMPLES} values"
    models = f"at most {MAX_MODELS} models"
    for path in (ROOT / "docs/live-view.md", ROOT / "proxy/ui/static/index.html"):
        text = " ".join(path.read_text().split())  # one line: sentences wrap anywhere
        said = re.findall(r"log histograms [^.]*?% wide.*?models per", text)
        assert said, path.name
        for sentence in said:
            for want in (width, within, exact, models):
                assert want in sentence, (path.name, want, sentence)
