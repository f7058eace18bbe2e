"""The phase clock is pure: fed known timestamps, it must derive the contract's numbers exactly."""

from __future__ import annotations

import pytest

from proxy.dialects import ANSWER, REASONING
from proxy.exchange.timing import MAX_THINKING_SPANS, PhaseClock, RequestTiming


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


R, A = REASONING, ANSWER


def run_kinds(
    tokens: list[tuple[float, int]], *, reported: int | None = None, reasoning: int | None = None, sent: float = 0.05
) -> RequestTiming:
    """A stream of (instant, kind) token events, from t0 = 10."""
    clock = PhaseClock(t0=10.0)
    clock.sent(10.0 + sent)
    for t, kind in tokens:
        clock.token(10.0 + t, kind)
    return clock.finish(10.0 + tokens[-1][0] + 0.01, reported, reasoning_tokens=reasoning)


def test_a_plain_stream_s_answer_starts_at_its_first_token() -> None:
    t = run([0.35, 0.37, 0.39])
    assert t.time_to_first_answer_token == t.ttft == pytest.approx(0.35)
    assert t.thinking is None and t.thinking_total is None and t.thinking_spans == ()
    assert t.reasoning_token_events == 0 and t.answer_tpot is None and t.thinking_estimated is None


def test_streamed_reasoning_is_a_thinking_phase_before_the_answer() -> None:
    # 5 reasoning tokens every 20 ms from 0.35, then 4 answer tokens every 20 ms from 0.45
    t = run_kinds([(0.35 + 0.02 * i, R) for i in range(5)] + [(0.45 + 0.02 * i, A) for i in range(4)])
    assert t.ttft == pytest.approx(0.35)  # unchanged: the first token of any kind
    assert t.time_to_first_answer_token == pytest.approx(0.45)
    assert t.thinking == pytest.approx(0.10)  # first token -> first answer token
    assert t.time_to_first_answer_token == pytest.approx(t.ttft + t.thinking)
    assert t.thinking_total == pytest.approx(0.10)
    assert t.thinking_spans == pytest.approx((10.35, 10.45))
    assert t.reasoning_token_events == 5
    assert t.answer_tpot == pytest.approx(0.02)  # 0.06 s over 4 - 1
    assert t.tpot == pytest.approx(0.16 / 8)  # unchanged: over all 9 tokens
    assert t.token_events == 9 and t.thinking_estimated is None


def test_interleaved_thinking_counts_every_run_but_only_the_first_delays_the_answer() -> None:
    # think 0.3-0.4, answer 0.4-0.5 (a tool call), think again 0.5-0.7, answer 0.7-0.8
    events = [(0.3, R), (0.35, R), (0.4, A), (0.45, A), (0.5, R), (0.6, R), (0.7, A), (0.8, A)]
    t = run_kinds(events)
    assert t.thinking == pytest.approx(0.1)
    assert t.thinking_total == pytest.approx(0.1 + 0.2)
    assert t.thinking_spans == pytest.approx((10.3, 10.4, 10.5, 10.7))
    assert t.reasoning_token_events == 4
    assert t.answer_tpot == pytest.approx((0.5 - 0.3) / (4 - 1))  # decode less the thinking, over 4 - 1


def test_an_answer_first_then_thinking_has_no_thinking_phase() -> None:
    t = run_kinds([(0.3, A), (0.4, R), (0.5, R), (0.6, A)])
    assert t.thinking is None  # nothing delayed the answer
    assert t.thinking_total == pytest.approx(0.2) and t.thinking_spans == pytest.approx((10.4, 10.6))
    assert t.time_to_first_answer_token == t.ttft == pytest.approx(0.3)


def test_a_stream_that_never_answers_thought_until_its_last_token() -> None:
    t = run_kinds([(0.3, R), (0.4, R), (0.5, R)])
    assert t.time_to_first_answer_token is None
    assert t.thinking == pytest.approx(0.2) and t.thinking_total == pytest.approx(0.2)
    assert t.thinking_spans == pytest.approx((10.3, 10.5))


def test_reasoning_and_answer_in_one_read_think_for_no_time() -> None:
    t = run_kinds([(0.3, R), (0.3, A), (0.4, A)])
    assert t.thinking == 0.0 and t.reasoning_token_events == 1


def test_reported_reasoning_splits_the_output_count() -> None:
    # 2 reasoning events and 3 answer events; the upstream reports 10 output tokens, 4 of them reasoning
    t = run_kinds([(0.3, R), (0.35, R), (0.4, A), (0.5, A), (0.6, A)], reported=10, reasoning=4)
    assert t.answer_tpot == pytest.approx(0.2 / (6 - 1))


def test_hidden_reasoning_is_estimated_at_the_answer_s_pace() -> None:
    # nothing streamed before 2.05 s; then 5 answer tokens 20 ms apart; 80 of 85 output tokens were reasoning
    t = run_kinds([(2.05 + 0.02 * i, A) for i in range(5)], reported=85, reasoning=80)
    assert t.thinking is None and t.reasoning_token_events == 0  # nothing was measured
    assert t.answer_tpot == pytest.approx(0.02)
    assert t.thinking_estimated == pytest.approx(80 * 0.02)
    assert t.prefill_wait == pytest.approx(2.0) and t.tpot == pytest.approx(0.08 / 84)


def test_the_hidden_estimate_never_exceeds_prefill_wait() -> None:
    t = run_kinds([(0.25 + 0.02 * i, A) for i in range(5)], reported=1005, reasoning=1000)
    assert t.thinking_estimated == pytest.approx(t.prefill_wait) == pytest.approx(0.2)


def test_no_estimate_without_an_answer_pace() -> None:
    # one answer token: no time per token to estimate with
    assert run_kinds([(1.0, A)], reported=41, reasoning=40).thinking_estimated is None
    # reasoning tokens reported as 0 (every OpenAI model reports the field)
    assert run_kinds([(1.0, A), (1.1, A)], reported=2, reasoning=0).thinking_estimated is None


def test_thinking_spans_are_capped_but_every_run_counts() -> None:
    events = []
    for i in range(MAX_THINKING_SPANS + 5):
        events += [(1.0 + i * 0.1, R), (1.05 + i * 0.1, A)]
    t = run_kinds(events)
    assert len(t.thinking_spans) == 2 * MAX_THINKING_SPANS
    assert t.thinking_total == pytest.approx(0.05 * (MAX_THINKING_SPANS + 5))
    assert t.reasoning_token_events == MAX_THINKING_SPANS + 5


def test_a_plug_in_s_true_is_an_answer_token() -> None:
    clock = PhaseClock(t0=0.0)
    clock.sent(0.1)
    clock.token(0.5, True)
    clock.token(0.6, True)
    t = clock.finish(0.7)
    assert t.time_to_first_answer_token == pytest.approx(0.5) and t.thinking_total is None
