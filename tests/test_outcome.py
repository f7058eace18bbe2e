"""The outcome of a request, decided from facts alone (pure): each rule of `proxy.exchange.outcome`, and
the vocabulary it speaks is the one the metrics and docs/errors.md use."""

from __future__ import annotations

from typing import get_args

import pytest

from proxy.errors import ERROR_TYPES
from proxy.exchange.outcome import End, Facts, Outcome, decide


def test_a_refusal_is_the_proxys_own_answer_whatever_else_happened() -> None:
    facts = Facts(status=504, refused="timeout", end="client_left", whole=True, stream_error=True)
    assert decide(facts) == Outcome(504, "timeout")


@pytest.mark.parametrize("whole", [False, True])
def test_a_failure_of_the_proxys_own_code_is_internal_error_never_the_clients(whole: bool) -> None:
    # Before this word existed, an exception in the relay was recorded as client_abort.
    assert decide(Facts(status=200, end="internal", whole=whole, stream_error=True)) == Outcome(200, "internal_error")


@pytest.mark.parametrize(
    ("end", "word"),
    [("client_left", "client_abort"), ("drained", "shutdown"), ("stream_cut", "stream_cut"), ("timeout", "timeout")],
)
def test_an_early_end_before_the_whole_answer(end: End, word: str) -> None:
    assert decide(Facts(status=200, end=end)) == Outcome(200, word)  # type: ignore[arg-type]


@pytest.mark.parametrize("end", ["client_left", "drained", "stream_cut", "timeout"])
def test_an_early_end_after_the_whole_answer_is_clean_and_timed_to_the_last_byte(end: End) -> None:
    assert decide(Facts(status=200, end=end, whole=True)) == Outcome(200, "", at_last_byte=True)
    # ... and still carries the status's word, or the stream's own error (response.failed).
    assert decide(Facts(status=429, end=end, whole=True)) == Outcome(429, "rate_limited", at_last_byte=True)
    assert decide(Facts(status=200, end=end, whole=True, stream_error=True)) == Outcome(200, "stream_error", True)


@pytest.mark.parametrize("end", ["client_left", "drained"])
def test_leaving_on_the_streams_own_error_blames_the_upstream(end: End) -> None:
    assert decide(Facts(status=200, end=end, stream_error=True)) == Outcome(200, "stream_error", at_last_byte=True)


def test_an_upstream_cut_after_a_stream_error_is_still_a_cut() -> None:
    assert decide(Facts(status=200, end="stream_cut", stream_error=True)) == Outcome(200, "stream_cut")


def test_a_complete_exchange_takes_the_statuss_word_then_the_streams_error() -> None:
    assert decide(Facts(status=200)) == Outcome(200, "")
    assert decide(Facts(status=200, stream_error=True)) == Outcome(200, "stream_error")
    assert decide(Facts(status=404, error_head=b'{"error": "model x not found"}')) == Outcome(404, "model_not_found")
    assert decide(Facts(status=404)) == Outcome(404, "not_found")
    assert decide(Facts(status=503, stream_error=True)) == Outcome(503, "upstream_error")


def test_every_word_decide_can_say_is_in_the_vocabulary() -> None:
    said: set[str] = set()
    for end in get_args(End):
        for whole in (False, True):
            for stream_error in (False, True):
                for status in (200, 400, 401, 404, 408, 413, 429, 500):
                    said.add(decide(Facts(status=status, end=end, whole=whole, stream_error=stream_error)).error_type)
    assert said - {""} <= set(ERROR_TYPES)
    assert {"internal_error", "client_abort", "shutdown", "stream_cut", "timeout", "stream_error"} <= said
