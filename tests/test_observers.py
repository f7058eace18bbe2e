"""Sinks of finished records, each in its own guard: a raising sink is counted and logged
(rate-limited, its stack without its message), and the sinks after it still run."""

from __future__ import annotations

import logging

import pytest

from proxy.exchange.observers import Named, Observers
from proxy.logs.ratelimited import RateLimitedLog
from proxy.telemetry.exposition import Counter, Registry


def _counter() -> Counter:
    return Counter("taotrace_sink_errors", "Sink failures.", ("sink",), registry=Registry())


def _values(errors: Counter) -> dict[str, float]:
    return {key[0]: child.value for key, child in errors.children.items()}


def broken(record: str) -> None:
    raise KeyError(record)


def test_a_raising_sink_is_counted_and_logged_and_the_next_still_runs(caplog: pytest.LogCaptureFixture) -> None:
    errors = _counter()
    seen: list[str] = []
    sinks: Observers[str] = Observers(
        [Named("metrics", broken), Named("live_view", seen.append)],
        errors,
        RateLimitedLog(logging.getLogger("taotrace.test_sinks")),
        more=("spans",),
    )
    assert _values(errors) == {"metrics": 0, "live_view": 0, "spans": 0}  # from the start
    with caplog.at_level(logging.WARNING, "taotrace.test_sinks"):
        for record in ("sk-canary-1", "sk-canary-2", "sk-canary-3"):
            sinks(record)
    assert seen == ["sk-canary-1", "sk-canary-2", "sk-canary-3"]
    assert _values(errors) == {"metrics": 3, "live_view": 0, "spans": 0}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1  # rate-limited: the same failure again is only counted
    assert "the metrics sink failed" in lines[0] and "KeyError" in lines[0] and "in broken" in lines[0]
    assert "canary" not in lines[0]  # an exception's message can quote data: never logged


def test_a_sink_run_by_the_caller_is_counted_under_its_name() -> None:
    errors = _counter()
    sinks: Observers[str] = Observers(
        [], errors, RateLimitedLog(logging.getLogger("taotrace.test_sinks")), more=("spans",)
    )
    try:
        broken("x")
    except KeyError as exc:
        sinks.failed("spans", exc)
    assert _values(errors) == {"spans": 1}
