"""The log-line rate limiter (pure), driven by a fake clock, and its logging adapter."""

from __future__ import annotations

import asyncio
import logging

import pytest

from proxy.logs.limiter import LogLimiter, Repeats
from proxy.logs.ratelimited import RateLimitedLog, flushing, summary


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_line_of_a_kind_goes_out_at_once_and_the_rest_are_counted() -> None:
    clock = FakeClock()
    limiter: LogLimiter[str] = LogLimiter(60.0, clock)
    assert limiter.admit("a") is True
    clock.now += 1
    assert [limiter.admit("a") for _ in range(37)] == [False] * 37
    assert limiter.admit("b") is True  # kinds are independent
    assert limiter.due() == []  # nothing due before the interval ends
    clock.now += 59.5
    assert limiter.due() == [Repeats("a", 37, 60.5)]
    assert limiter.due() == []  # each count is reported once


def test_a_steady_stream_gives_one_summary_per_interval() -> None:
    clock = FakeClock()
    limiter: LogLimiter[str] = LogLimiter(10.0, clock)
    out: list[bool] = []
    summaries: list[Repeats[str]] = []
    for _ in range(300):  # one line a second for five minutes, due() called every second
        out.append(limiter.admit("x"))
        clock.now += 1
        summaries += limiter.due()
    assert out.count(True) == 1  # only the very first went out unsummarised
    assert len(summaries) == 30 and sum(s.count for s in summaries) == 299
    assert all(s.seconds == 10.0 for s in summaries)


def test_a_kind_quiet_for_a_whole_interval_logs_at_once_again() -> None:
    clock = FakeClock()
    limiter: LogLimiter[str] = LogLimiter(60.0, clock)
    assert limiter.admit("x")
    assert not limiter.admit("x")
    clock.now += 60
    assert limiter.due() == [Repeats("x", 1, 60.0)]
    clock.now += 60
    assert limiter.due() == []  # quiet since the summary: forgotten
    assert limiter.admit("x") is True
    # ... and without due() being called, a line after a quiet interval still goes out.
    clock.now += 61
    assert limiter.admit("x") is True


def test_a_count_whose_interval_ended_waits_for_due_rather_than_being_lost() -> None:
    clock = FakeClock()
    limiter: LogLimiter[str] = LogLimiter(60.0, clock)
    limiter.admit("x")
    limiter.admit("x")
    clock.now += 120
    assert limiter.admit("x") is False  # counted with the one held back, not sent on its own
    assert limiter.due() == [Repeats("x", 2, 120.0)]


def test_pending_hands_back_every_count_at_exit() -> None:
    clock = FakeClock()
    limiter: LogLimiter[str] = LogLimiter(60.0, clock)
    for kind in ("a", "a", "a", "b", "c", "c"):
        limiter.admit(kind)
    clock.now += 5
    assert sorted(limiter.pending(), key=lambda r: r.kind) == [Repeats("a", 2, 5.0), Repeats("c", 1, 5.0)]
    assert limiter.pending() == [] and limiter.admit("a") is True


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LogLimiter(0, FakeClock())


def test_the_adapter_logs_the_first_line_then_a_summary(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    log = RateLimitedLog(logging.getLogger("taotrace.test"), interval=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="taotrace.test"):
        for _ in range(38):
            log.warning("upstream http://h:1 failed: connection refused (answered 502)")
        log.flush()
        clock.now += 60
        log.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "upstream http://h:1 failed: connection refused (answered 502)",
        "upstream http://h:1 failed: connection refused (answered 502) (37 more in the last 60 s)",
    ]
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in caplog.records)
    assert summary(Repeats("x", 2, 59.6)) == "x (2 more in the last 60 s)"
    assert summary(Repeats("x", 4, 0.4)) == "x (4 more in the last 0.4 s)"  # a stop soon after: never "0 s"


async def test_flushing_logs_summaries_as_intervals_end_and_what_is_left_at_exit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = RateLimitedLog(logging.getLogger("taotrace.test"), interval=0.2)
    with caplog.at_level(logging.WARNING, logger="taotrace.test"):
        async with flushing(log):
            for _ in range(3):
                log.warning("a")
            # The summary comes by itself (ticks every interval / 4); generous for a loaded machine.
            for _ in range(200):
                if len(caplog.records) == 2:
                    break
                await asyncio.sleep(0.01)
            assert [r.getMessage() for r in caplog.records][1].startswith("a (2 more in the last ")
            log.warning("a")  # within the new interval: held back ...
        assert caplog.records[-1].getMessage().startswith("a (1 more in the last ")  # ... and logged at exit
