"""The benchmark's pure reductions (tests/bench/samples.py): percentiles and first-token matching."""

from __future__ import annotations

import math

import pytest

from tests.bench.samples import batch_spread, first_token_lags, lag_summary, pct, proxy_first_tokens


def test_pct_interpolates_as_numpy_does() -> None:
    values = [5, 1, 4, 2, 3]  # unsorted on purpose
    assert pct(values, 0.0) == 1 and pct(values, 1.0) == 5 and pct(values, 0.5) == 3
    assert pct(values, 0.95) == pytest.approx(4.8)  # numpy.percentile(values, 95)
    assert pct([7], 0.99) == 7
    assert math.isnan(pct([], 0.5))


def test_rows_give_each_traced_first_token() -> None:
    rows: list[dict[str, object]] = [
        {"trace_id": "a" * 32, "first_token_monotonic": 100.25},
        {"trace_id": "b" * 32, "first_token_monotonic": None},  # no first token (an error)
        {"trace_id": None, "first_token_monotonic": 100.5},  # not traced (outcome sampling dropped it)
        {"trace_id": "c" * 32},  # an older proxy without the field
    ]
    assert proxy_first_tokens(rows) == {"a" * 32: 100.25}
    last = [{"trace_id": "a" * 32, "first_token_monotonic": 100.25, "last_token_monotonic": 100.5}]
    assert proxy_first_tokens(last, "last_token_monotonic") == {"a" * 32: 100.5}


def test_lags_match_by_trace_id_only() -> None:
    upstream = {"a": 10.0, "b": 20.0, "gone": 30.0}  # "gone": the proxy's ring forgot it
    proxy = {"a": 10.0004, "b": 20.0021, "other": 5.0}  # "other": a request of another cell
    assert sorted(first_token_lags(upstream, proxy)) == [400_000, 2_100_000]


def test_summary_in_ms_with_coverage() -> None:
    lags = [100_000 * i for i in range(1, 101)]  # 0.1 ... 10 ms
    s = lag_summary(lags, expected=104)
    assert (s["matched"], s["expected"]) == (100, 104)
    assert s["p50_ms"] == pytest.approx(5.05) and s["p99_ms"] == pytest.approx(9.901)
    assert s["max_ms"] == pytest.approx(10.0)
    empty = lag_summary([], expected=3)
    assert empty["matched"] == 0 and empty["p95_ms"] is None and empty["max_ms"] is None


def test_batch_spread_compares_first_and_last() -> None:
    upstream = {"a": 1.0, "b": 1.0002, "c": 1.0001, "gone": 0.5}
    proxy = {"a": 1.0001, "b": 1.0031, "c": 1.0016}  # taken one after another
    assert batch_spread(upstream, proxy) == (200_000, 3_000_000)
    assert batch_spread({"a": 1.0}, {"a": 1.1}) is None  # one stream: no spread
