"""The phase clock is pure: fed known timestamps, it must derive the contract's numbers exactly."""

from __future__ import annotations

import pytest

from proxy.exchange.timing import PhaseClock


def run(
    tokens: list[float],
    *,
    sent: float = 0.05,
    end: float | None = None,
    reported: int | None = None,
    streaming: bool = True,
):
    clock = PhaseClock(t0=10.0)
    clock.sent(10.0 + sent)
    clock.headers(10.0 + sent + 0.01)
    clock.body_bytes(10.0 + sent + 0.02)
    for t in tokens:
        clock.token(10.0 + t)
    return clock.finish(
        10.0 + (end if end is not None else (tokens[-1] + 0.01 if tokens else 1.0)), reported, streaming=streaming
    )


def test_phases_ttft_tpot_itl() -> None:
    t = run([0.35, 0.37, 0.39, 0.41, 0.43])
    assert t.network == pytest.approx(0.05)
    assert t.ttft == pytest.approx(0.35)
    assert t.prefill_wait == pytest.approx(0.30)
    assert t.decode == pytest.approx(0.08)
    assert t.tpot == pytest.approx(0.02)  # (last - first) / (5 - 1)
    assert t.itl == pytest.approx((0.02, 0.02, 0.02, 0.02))
    assert t.ttfb == pytest.approx(0.07)
    assert t.time_to_headers == pytest.approx(0.06)
    assert t.duration == pytest.approx(0.44)
    assert t.token_events == 5


def test_tpot_uses_reported_output_tokens() -> None:
    # 5 token events carried 9 tokens: TPOT divides the decode time by 9 - 1
    t = run([0.35, 0.37, 0.39, 0.41, 0.43], reported=9)
    assert t.tpot == pytest.approx(0.08 / 8)


def test_single_token_has_no_tpot() -> None:
    t = run([0.2])
    assert t.ttft == pytest.approx(0.2) and t.decode == 0 and t.tpot is None and t.itl == ()


def test_no_tokens_no_stream_phases() -> None:
    t = run([], end=0.5)
    assert t.ttft is None and t.prefill_wait is None and t.decode is None and t.tpot is None
    assert t.network == pytest.approx(0.05) and t.duration == pytest.approx(0.5)


def test_non_streaming_never_has_token_timings() -> None:
    t = run([0.3, 0.4], streaming=False)
    assert t.ttft is None and t.tpot is None and t.itl == ()


def test_nothing_sent_means_no_network_phase() -> None:
    clock = PhaseClock(t0=1.0)
    t = clock.finish(1.5)
    assert t.network is None and t.duration == pytest.approx(0.5)


def test_first_chunk_precedes_first_token_and_chunk_gaps() -> None:
    clock = PhaseClock(t0=10.0)
    clock.sent(10.01)
    clock.chunk(10.10)  # role-only delta: a chunk, not a token
    for at in (10.30, 10.32, 10.35):
        clock.chunk(at)
        clock.token(at)
    clock.chunk(10.36)  # usage chunk
    t = clock.finish(10.4)
    assert t.ttfc == pytest.approx(0.10)
    assert t.ttft == pytest.approx(0.30)
    assert t.chunk_gaps == pytest.approx((0.20, 0.02, 0.03, 0.01))
    assert t.itl == pytest.approx((0.02, 0.03))


def test_non_streaming_has_no_chunk_times() -> None:
    clock = PhaseClock(t0=0.0)
    clock.chunk(0.1)
    t = clock.finish(0.2, streaming=False)
    assert t.ttfc is None and t.chunk_gaps == ()


def test_request_overhead_leaves_out_the_networks_steps() -> None:
    clock = PhaseClock(t0=0.0)
    clock.pool_wait, clock.dns, clock.connect = 0.002, 0.010, 0.030
    clock.sent(0.0432)
    t = clock.finish(1.0, streaming=False)
    assert t.network == pytest.approx(0.0432)
    assert t.overhead_request == pytest.approx(0.0012)  # 43.2 ms - 2 - 10 - 30
    assert PhaseClock(t0=0.0).finish(1.0).overhead_request is None  # never written upstream
