"""`taotrace compare`: the statistics (seeded), the order of requests, the prompts file and its
errors, the live view's captured input, and two real simulators with different physics, driven
through the command line (pure JSON on stdout, an SVG, Ctrl-C, keys never shown)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import re
import signal
import sys
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.cli import main
from proxy.sim import SimRunning, SimSettings, running
from proxy.tools.client import Measurement, request_for
from proxy.tools.compare import CompareProgress, CompareSettings, compare, sides_from
from proxy.tools.compare_live import LiveError, live_prompts
from proxy.tools.compare_plan import METRICS, Sample, Step, schedule
from proxy.tools.compare_prompts import BUILTIN_PROMPTS, Prompt, PromptError, call_for, parse_jsonl
from proxy.tools.compare_report import TargetInfo, result, text
from proxy.tools.compare_stats import MIN_PAIRS, Difference, paired_difference, percentile
from proxy.tools.compare_verdict import Thresholds, decide
from tests.conftest import ProxyFactory
from tests.fakes import chat_stream, stream_handler

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-compare-secret-0f3a9c"
SVG_NS = "{http://www.w3.org/2000/svg}"

# --- the statistics ------------------------------------------------------------------------------


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile([7.0], 95) == 7.0
    assert percentile(list(map(float, range(101))), 95) == 95.0


def test_a_constant_shift_is_found_exactly_and_is_significant() -> None:
    rng = random.Random(1)
    a = [rng.uniform(0.05, 0.5) for _ in range(40)]
    d = paired_difference([(x, x + 0.02) for x in a], random.Random(7))
    assert d is not None and d.pairs == 40
    assert d.diff == pytest.approx(0.02) and d.low == pytest.approx(0.02) and d.high == pytest.approx(0.02)
    assert d.significant


def test_too_few_pairs_are_never_a_verdict() -> None:
    # One server against itself, 3 pairs: a percentile bootstrap on so few pairs gives an
    # interval far too narrow, so below MIN_PAIRS nothing is called significant.
    few = paired_difference([(0.0326, 0.0327), (0.0325, 0.0327), (0.0328, 0.0329)], random.Random(1))
    assert few is not None and few.low > 0 and not few.enough and not few.significant
    one = paired_difference([(0.010, 0.026)], random.Random(1))
    assert one is not None and not one.significant
    shifted = [(x / 100, x / 100 + 0.02) for x in range(MIN_PAIRS)]
    enough = paired_difference(shifted, random.Random(1))
    assert enough is not None and enough.enough and enough.significant


def test_bootstrap_interval_holds_the_true_ratio_and_is_reproducible() -> None:
    rng = random.Random(3)
    pairs = []
    for _ in range(60):
        base = rng.lognormvariate(-3.0, 0.3)  # ~50 ms, B half of A, each with its own noise
        pairs.append((base * rng.uniform(0.9, 1.1), 0.5 * base * rng.uniform(0.9, 1.1)))
    first = paired_difference(pairs, random.Random(11))
    again = paired_difference(pairs, random.Random(11))
    assert first == again  # a seeded RNG: the same interval every time
    assert first is not None and first.significant and first.high < 0
    assert first.low <= first.diff <= first.high
    assert first.ratio is not None and 0.4 < first.ratio < 0.6


def test_the_same_distribution_gives_no_significant_difference() -> None:
    rng = random.Random(5)
    pairs = [(rng.gauss(0.1, 0.01), rng.gauss(0.1, 0.01)) for _ in range(50)]
    d = paired_difference(pairs, random.Random(2))
    assert d is not None and not d.significant and d.low < 0 < d.high
    assert paired_difference([], random.Random(0)) is None


def test_fewer_resamples_for_many_pairs_and_none_for_one() -> None:
    assert paired_difference([(0.1, 0.2)] * 20, random.Random(0)).resamples == 2000  # type: ignore[union-attr]
    many = paired_difference([(0.1, 0.2)] * 2000, random.Random(0))
    assert many is not None and many.resamples == 500 and many.diff == pytest.approx(0.1)
    one = paired_difference([(0.1, 0.3)], random.Random(0))
    assert one is not None and one.diff == pytest.approx(0.2) and one.low == one.high == pytest.approx(0.2)


# --- the verdict: more than noise, and large enough to matter ------------------------------------

BY_KEY = {m.key: m for m in METRICS}
LIMITS = Thresholds(duration_s=0.005, per_token_s=0.0005, relative=0.05)  # the defaults


def _certain(a: float, b: float, pairs: int = 15) -> Difference:
    """A difference of medians whose interval excludes 0: more than noise, by construction."""
    return Difference(pairs, a, b, min(b - a, 0.9 * (b - a)), max(b - a, 0.9 * (b - a)), 0.95)


def test_the_reported_certain_0_015_ms_is_no_difference_that_matters() -> None:
    d = decide(_certain(0.000034, 0.000019), BY_KEY["network_s"], LIMITS)
    assert d.verdict == "below_threshold" and not d.matters
    assert d.faster == "B"  # the statistics still say which way, and the report shows it
    assert not d.above_absolute and d.above_relative  # 1.79x is far above 5%, 0.015 ms far below 5 ms
    assert d.size_s == pytest.approx(0.000015) and d.share == pytest.approx(0.015 / 0.034)


def test_50_ms_on_a_10_s_duration_fails_the_relative_threshold_alone() -> None:
    d = decide(_certain(10.0, 9.95), BY_KEY["total_s"], LIMITS)
    assert d.above_absolute and not d.above_relative
    assert d.verdict == "below_threshold" and d.faster == "B" and d.share == pytest.approx(0.005)


def test_a_difference_matters_when_it_passes_both() -> None:
    d = decide(_certain(0.200, 0.150), BY_KEY["ttft_s"], LIMITS)
    assert d.above_absolute and d.above_relative and d.matters
    assert (d.verdict, d.faster) == ("faster", "B")
    slower_b = decide(_certain(0.150, 0.200), BY_KEY["ttft_s"], LIMITS)
    assert (slower_b.verdict, slower_b.faster) == ("faster", "A") and slower_b.share == pytest.approx(0.25)


def test_a_difference_equal_to_a_threshold_reaches_it() -> None:
    # 0.105 - 0.100 is 0.00499999… in floats: equal as written still counts
    at_both = decide(_certain(0.100, 0.105), BY_KEY["ttft_s"], Thresholds(0.005, 0.0005, 0.005 / 0.105))
    assert at_both.above_absolute and at_both.above_relative and at_both.verdict == "faster"
    at_share = decide(_certain(0.100, 0.095), BY_KEY["ttft_s"], LIMITS)  # 5 ms of the slower 100 ms: 5%
    assert at_share.above_absolute and at_share.above_relative and at_share.verdict == "faster"
    just_under = decide(_certain(0.100, 0.1049), BY_KEY["ttft_s"], Thresholds(0.005, 0.0005, 0.0))
    assert not just_under.above_absolute and just_under.verdict == "below_threshold"
    under_share = decide(_certain(0.100, 0.0951), BY_KEY["ttft_s"], Thresholds(0.0, 0.0, 0.05))
    assert not under_share.above_relative and under_share.verdict == "below_threshold"


def test_per_token_measures_have_their_own_absolute_threshold() -> None:
    tpot = decide(_certain(0.0100, 0.0094), BY_KEY["tpot_s"], LIMITS)  # 0.6 ms per token, 6%
    assert tpot.min_size_s == 0.0005 and tpot.verdict == "faster"
    ttft = decide(_certain(0.0100, 0.0094), BY_KEY["ttft_s"], LIMITS)  # the same 0.6 ms on a whole request
    assert ttft.min_size_s == 0.005 and ttft.verdict == "below_threshold"


def test_tokens_per_second_are_compared_as_time_per_token() -> None:
    rate = BY_KEY["tokens_per_s"]
    # 100 -> 104 tok/s: 10 ms -> 9.6 ms per token, 0.38 ms and 3.8%: under both
    small = decide(_certain(100.0, 104.0), rate, LIMITS)
    assert small.size_s == pytest.approx(1 / 100 - 1 / 104)
    assert not small.above_absolute and not small.above_relative and small.verdict == "below_threshold"
    # 20 -> 21.5 tok/s: 50 ms -> 46.5 ms per token, 7% of the time per token; B is faster (higher)
    big = decide(_certain(20.0, 21.5), rate, LIMITS)
    assert (big.verdict, big.faster) == ("faster", "B")
    assert big.share == pytest.approx(1 - (1 / 21.5) / (1 / 20))  # the same share as the time per token
    stalled = decide(_certain(0.0, 21.5), rate, LIMITS)
    assert stalled.size_s is None and stalled.above_absolute and stalled.verdict == "faster"


def test_thresholds_never_turn_noise_or_too_few_pairs_into_a_verdict() -> None:
    noise = decide(Difference(40, 0.100, 0.200, -0.010, 0.150, 0.95), BY_KEY["ttft_s"], LIMITS)
    assert noise.above_absolute and noise.above_relative
    assert (noise.verdict, noise.faster) == ("not_significant", None)
    few = decide(_certain(0.100, 0.200, pairs=MIN_PAIRS - 1), BY_KEY["ttft_s"], LIMITS)
    assert (few.verdict, few.faster) == ("too_few_pairs", None)
    off = decide(_certain(0.000034, 0.000019), BY_KEY["network_s"], Thresholds(0.0, 0.0, 0.0))
    assert off.verdict == "faster"  # 0 turns the thresholds off: the statistics alone decide


def _measured(ttft: float, tpot: float, rtt: float) -> Measurement:
    tokens = 10
    decode = tpot * (tokens - 1)
    return Measurement(
        "chat_completions", "m", 200, ttft, ttft, ttft + decode, tokens, "reported", tpot, tokens / decode,
        tokens, tokens + 1, 0, True, True, rtt_s=rtt, connect_s=0.0,
    )  # fmt: skip


def test_the_report_says_no_difference_that_matters_and_still_shows_the_difference_and_ratio() -> None:
    rng = random.Random(9)
    samples = []
    for r in range(15):  # B: TTFT 40% shorter, TPOT 1% shorter, network 0.034 -> 0.019 ms
        ttft, tpot = rng.uniform(0.30, 0.34), rng.uniform(0.020, 0.021)
        samples.append(Sample(Step(r, 0, 0), _measured(ttft, tpot, 0.000034)))
        samples.append(Sample(Step(r, 0, 1), _measured(0.6 * ttft, 0.99 * tpot, 0.000019)))
    doc = result(
        targets=[TargetInfo("http://a.test/v1", "m")] * 2, api="chat_completions", prompts=PROMPTS[:1], rounds=15,
        order="alternate", samples=samples, planned=30, interrupted=False, rng=random.Random(0), thresholds=LIMITS,
    )  # fmt: skip
    assert doc["thresholds"] == {"duration_s": 0.005, "per_token_s": 0.0005, "relative": 0.05}
    network = doc["differences"]["network_s"]
    assert network["significant"] and network["faster"] == "B" and not network["matters"]
    assert network["verdict"] == "below_threshold"
    assert network["absolute"] == {"diff_s": pytest.approx(0.000015), "threshold_s": 0.005, "per_token": False,
                                   "passed": False}  # fmt: skip
    assert network["relative"]["passed"] and network["relative"]["threshold"] == 0.05
    tpot = doc["differences"]["tpot_s"]
    assert tpot["significant"] and tpot["verdict"] == "below_threshold"
    assert not tpot["absolute"]["passed"] and not tpot["relative"]["passed"]
    assert doc["differences"]["ttft_s"]["verdict"] == "faster" and doc["differences"]["ttft_s"]["matters"]
    report = text(doc)
    row = next(line for line in report.splitlines() if line.startswith("network "))
    assert "-0.015 ms [-0.015 ms, -0.015 ms]" in row  # the measured difference stays in view
    assert row.endswith("no difference that matters (B 1.79x faster, under 5 ms)"), row
    assert "B faster, 1.79x" not in report
    assert re.search(r"\nTPOT: no difference that matters \(A 20\.\d ms, B 20\.\d ms; B - A = -0\.\d{3} ms, 1\.01x: "
                     r"more than noise, 95% CI .*, 15 pairs, but under 0\.5 ms/token and 5%\)\n", report), report  # fmt: skip
    assert "\nTTFT: B is faster (A " in report
    assert "a difference matters from 5 ms (0.5 ms/token for TPOT and tok/s) and 5% of the slower side" in report


def test_the_thresholds_come_from_the_settings_in_ms_and_percent(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CompareSettings().thresholds() == Thresholds(0.005, 0.0005, 0.05)
    monkeypatch.setenv("TAOTRACE_MIN_DIFF_PERCENT", "12.5")
    mine = CompareSettings(min_diff_ms=20, min_tpot_diff_ms=0)
    assert mine.thresholds() == Thresholds(0.02, 0.0, 0.125)


# --- the order of requests -----------------------------------------------------------------------


def test_alternate_order_is_abba_and_every_pair_is_complete() -> None:
    steps = schedule(prompts=3, rounds=2, order="alternate", rng=random.Random(0))
    assert "".join("AB"[s.target] for s in steps) == "ABBAABBAABBA"
    assert [(s.round, s.prompt) for s in steps[::2]] == [(r, p) for r in range(2) for p in range(3)]
    assert all({steps[i].target, steps[i + 1].target} == {0, 1} for i in range(0, len(steps), 2))


def test_random_order_is_seeded_and_balanced() -> None:
    one = schedule(prompts=10, rounds=10, order="random", rng=random.Random(4))
    two = schedule(prompts=10, rounds=10, order="random", rng=random.Random(4))
    assert one == two
    firsts = sum(1 for s in one[::2] if s.target == 0)
    assert 30 < firsts < 70  # 100 fair coin flips
    assert all({one[i].target, one[i + 1].target} == {0, 1} for i in range(0, len(one), 2))


# --- prompts -------------------------------------------------------------------------------------


def test_every_documented_jsonl_shape_is_read() -> None:
    lines = [
        {"prompt": "Explain TCP slow start."},
        {"name": "chatty", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
        {
            "system": [{"type": "text", "text": "Sys"}],
            "messages": [{"role": "user", "content": "Hey"}],
            "max_tokens": 9,
        },
        {"input": "Plain input"},
        {"input": [{"role": "developer", "content": "Dev"}, {"role": "user", "content": "In"}]},
    ]
    prompts = parse_jsonl("\n".join(json.dumps(x) for x in lines[:2]) + "\n\n" + "\n".join(
        json.dumps(x) for x in lines[2:]), "p.jsonl")  # fmt: skip
    assert [p.name for p in prompts] == ["line-1", "chatty", "line-4", "line-5", "line-6"]
    assert prompts[0].turns == ({"role": "user", "content": "Explain TCP slow start."},) and prompts[0].system is None
    assert prompts[1].system == "Be brief." and prompts[1].turns == ({"role": "user", "content": "Hi"},)
    assert prompts[2].system == "Sys" and prompts[2].max_tokens == 9
    assert prompts[4].system == "Dev" and prompts[4].turns == ({"role": "user", "content": "In"},)


@pytest.mark.parametrize(
    "line,words",
    [
        ("{not json", "line 2: not JSON"),
        ('["a list"]', "line 2: expected a JSON object"),
        ('{"promt": "typo"}', "line 2: unknown key 'promt'"),
        ('{"name": "x"}', "line 2: needs exactly one of 'prompt', 'messages' or 'input'"),
        ('{"prompt": "a", "messages": []}', "line 2: needs exactly one"),
        ('{"prompt": "   "}', "line 2: 'prompt' is empty"),
        ('{"messages": []}', "line 2: 'messages' must be a non-empty list"),
        ('{"messages": [{"content": "no role"}]}', "line 2: messages[0] must be an object with 'role' and 'content'"),
        ('{"messages": [{"role": "system", "content": "only"}]}', "line 2: 'messages' has no turn besides"),
        ('{"prompt": "a", "max_tokens": 0}', "line 2: 'max_tokens' must be a positive integer"),
        ('{"prompt": "a", "max_tokens": true}', "line 2: 'max_tokens' must be a positive integer"),
    ],
)
def test_bad_jsonl_says_which_line_and_what(line: str, words: str) -> None:
    with pytest.raises(PromptError) as caught:
        parse_jsonl('{"prompt": "fine"}\n' + line + "\n", "mine.jsonl")
    assert str(caught.value).startswith("mine.jsonl line 2: ") and words in str(caught.value)


def test_an_empty_file_is_an_error() -> None:
    with pytest.raises(PromptError, match="no prompts"):
        parse_jsonl("\n  \n", "empty.jsonl")


def test_each_dialect_gets_the_system_text_its_own_way() -> None:
    p = Prompt("p", ({"role": "user", "content": "Hi"},), system="Sys", max_tokens=7)
    chat = request_for(call_for(p, "chat_completions", "m", 64, {}))[1]
    assert chat["messages"] == [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}]
    assert chat["max_tokens"] == 7  # the prompt's own cap wins
    messages = request_for(call_for(p, "messages", "m", 64, {}))[1]
    assert messages["system"] == "Sys" and messages["messages"] == [{"role": "user", "content": "Hi"}]
    responses = request_for(call_for(p, "responses", "m", 64, {}))[1]
    assert responses["instructions"] == "Sys" and responses["input"] == [{"role": "user", "content": "Hi"}]
    completions = request_for(call_for(p, "completions", "m", 64, {}))[1]
    assert completions["prompt"] == "Sys\n\nHi"


def test_the_builtin_set_has_short_and_long_prompts() -> None:
    sizes = [len(str(p.turns[-1]["content"])) for p in BUILTIN_PROMPTS]
    assert min(sizes) < 100 and max(sizes) > 5000
    assert len({p.name for p in BUILTIN_PROMPTS}) == len(BUILTIN_PROMPTS)


# --- settings --------------------------------------------------------------------------------------


def test_targets_models_and_keys() -> None:
    env = {"KEY_A": "ka", "KEY_B": "kb", "TAOTOKEN_API_KEY": "default"}
    s = CompareSettings(
        base_url=["http://a.test/v1", "http://b.test/v1/"], model="m", model_b="mb", key_env=["KEY_A", "KEY_B"]
    )
    a, b = sides_from(s, env)
    assert (a.base_url, a.model, a.api_key) == ("http://a.test/v1", "m", "ka")
    assert (b.base_url, b.model, b.api_key) == ("http://b.test/v1", "mb", "kb")
    assert "ka" not in repr(a) and "kb" not in repr(b)
    one = sides_from(CompareSettings(base_url=["http://a.test/v1,http://b.test/v1"], key_env=["KEY_B"]), env)
    assert [x.api_key for x in one] == ["kb", "kb"]
    assert [x.api_key for x in sides_from(CompareSettings(base_url=["http://a.test", "http://b.test"]), env)] == [
        "default", "default"]  # fmt: skip
    with pytest.raises(ValueError, match="give two targets"):
        sides_from(CompareSettings(base_url=["http://a.test/v1"]), env)
    with pytest.raises(ValueError, match=r"\$NOPE is not set"):
        sides_from(CompareSettings(base_url=["http://a.test", "http://b.test"], key_env=["NOPE"]), env)


def test_progress_redraws_one_line_on_a_terminal_and_prints_lines_otherwise() -> None:
    m = Measurement("chat_completions", "m", 200, 0.01, 0.02, 0.1, 5, "reported", 0.01, 50.0, 5, 7, 0, True, True)
    tty, plain = io.StringIO(), io.StringIO()
    for stream, is_tty in ((tty, True), (plain, False)):
        progress = CompareProgress(stream, is_tty)
        progress(1, 4, Sample(Step(0, 0, 0), m), "short")
        progress(2, 4, Sample(Step(0, 0, 1), m), "short")
        progress.done()
    assert tty.getvalue().count("\r\x1b[K") == 3 and "\n" not in tty.getvalue()
    assert plain.getvalue().splitlines() == [
        "compare 1/4: A short round 1: TTFT 20.0 ms",
        "compare 2/4: B short round 1: TTFT 20.0 ms",
    ]


# --- two simulators with different physics ---------------------------------------------------------

SLOW_SCALE, FAST_SCALE = 1.0, 0.5  # every simulated duration of A twice B's


@pytest.fixture
async def sims() -> AsyncIterator[tuple[SimRunning, SimRunning]]:
    async with running(SimSettings(port=0, time_scale=SLOW_SCALE, require_key=True, api_keys=[SECRET])) as slow:
        async with running(SimSettings(port=0, time_scale=FAST_SCALE, require_key=True, api_keys=[SECRET])) as fast:
            yield slow, fast


PROMPTS = [
    Prompt("one", ({"role": "user", "content": "Name three prime numbers."},)),
    Prompt("two", ({"role": "user", "content": "Why is the sky blue? " * 40},), system="Be brief."),
    Prompt("three", ({"role": "user", "content": "Count to five."},)),
]


async def test_compare_finds_the_faster_simulator_and_the_size_of_the_difference(
    sims: tuple[SimRunning, SimRunning],
) -> None:
    slow, fast = sims
    settings = CompareSettings(base_url=[slow.base_url, fast.base_url], runs=3, max_tokens=8, key_env=["K"])
    sides = sides_from(settings, {"K": SECRET})
    samples: list[Sample] = []
    assert await compare(settings, sides, PROMPTS, samples) is None
    doc = result(
        targets=[TargetInfo(s.base_url, s.model) for s in sides], api="chat_completions", prompts=PROMPTS, rounds=3,
        order="alternate", samples=samples, planned=18, interrupted=False, rng=random.Random(0),
        thresholds=settings.thresholds(),
    )  # fmt: skip
    assert doc["completed"] == 18 and doc["failed"] == {"A": 0, "B": 0}
    for key in ("ttft_s", "tpot_s", "tokens_per_s"):
        d = doc["differences"][key]
        assert d["pairs"] == 9 and d["significant"] and d["faster"] == "B", (key, d)
    # B's durations are half A's: loaded-machine noise adds to both, so a broad band around 2x
    assert 1.4 < 1 / doc["differences"]["ttft_s"]["ratio"] < 2.8
    assert 1.4 < 1 / doc["differences"]["tpot_s"]["ratio"] < 2.8
    assert 1.4 < doc["differences"]["tokens_per_s"]["ratio"] < 2.8
    report = text(doc)
    assert "TTFT: B is faster (A " in report and "TPOT: B is faster" in report
    assert [r["prompt"] for r in doc["per_prompt"]] == ["one", "two", "three"]
    if sys.platform.startswith("linux"):  # the kernel's round trip: the network's share of the TTFT
        assert doc["summary"]["A"]["network_s"]["n"] == 9 and doc["summary"]["B"]["server_wait_s"]["n"] == 9


async def test_compare_reports_both_first_tokens_and_the_thinking(sims: tuple[SimRunning, SimRunning]) -> None:
    """A: o3-mini streams its thinking; B: o4-mini hides the same thinking. Both first-token
    times are compared, with the thinking measured on A's side and estimated on B's."""
    slow, fast = sims
    settings = CompareSettings(
        base_url=[fast.base_url, fast.base_url], model_a="o3-mini", model_b="o4-mini", runs=1, max_tokens=72,
        key_env=["K"],
    )  # fmt: skip
    sides = sides_from(settings, {"K": SECRET})
    samples: list[Sample] = []
    assert await compare(settings, sides, PROMPTS, samples) is None
    doc = result(
        targets=[TargetInfo(s.base_url, s.model) for s in sides], api="chat_completions", prompts=PROMPTS, rounds=1,
        order="alternate", samples=samples, planned=6, interrupted=False, rng=random.Random(0),
        thresholds=settings.thresholds(),
    )  # fmt: skip
    a, b = doc["summary"]["A"], doc["summary"]["B"]
    assert a["thinking_s"]["n"] == 3 and a["thinking_estimated_s"] is None
    assert b["thinking_s"] is None and b["thinking_estimated_s"]["n"] == 3
    assert a["ttft_s"]["p50"] < 0.5 * a["answer_ttft_s"]["p50"]  # A's first token is a thought
    assert b["ttft_s"]["p50"] == b["answer_ttft_s"]["p50"]  # B's is the answer's
    # the same model, the same thinking: one streamed, one hidden, the answer at the same time
    assert doc["differences"]["answer_ttft_s"]["pairs"] == 3
    assert a["ttft_s"]["p50"] < b["ttft_s"]["p50"]  # A's first thought comes long before B's first (answer) token
    assert b["thinking_estimated_s"]["p50"] == pytest.approx(a["thinking_s"]["p50"], rel=0.3)
    rows = [line.split("  ")[0] for line in text(doc).splitlines()]
    assert {"first answer token", "thinking", "~hidden thinking"} <= set(rows)
    assert any(line.startswith("first answer token: ") for line in text(doc).splitlines())
    m = doc["measurements"][0]
    assert {"answer_ttft_s", "thinking_s", "thinking_estimated_s"} <= set(m)
    plain = text(
        {
            **doc,
            "summary": {k: {**v, "thinking_s": None, "thinking_estimated_s": None} for k, v in doc["summary"].items()},
        }
    )
    assert "first answer token" not in plain  # nobody reasons: no row apart from the TTFT


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAOTRACE_") and k != "TAOTOKEN_API_KEY"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


async def _cli(
    *args: str, env: dict[str, str], stop_after: str | None = None, sig: int = signal.SIGINT
) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "compare", *args, env=env, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    err = b""
    if stop_after is not None:
        while stop_after.encode() not in err:
            line = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert line, err.decode()
            err += line
        proc.send_signal(sig)
    out, rest = await asyncio.wait_for(proc.communicate(), 120)
    return await proc.wait(), out.decode(), (err + rest).decode()


async def test_json_is_pure_json_on_stdout_and_the_plot_is_svg(
    sims: tuple[SimRunning, SimRunning], tmp_path: Path
) -> None:
    slow, fast = sims
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"name": p.name, "messages": list(p.turns)}) for p in PROMPTS[:2]) + "\n", "utf-8"
    )
    plot = tmp_path / "out.svg"
    code, out, err = await _cli(
        "--base-url", slow.base_url, "--base-url", fast.base_url, "--prompts", str(prompts), "--runs", "2",
        "--max-tokens", "4", "--json", "--plot", str(plot), "--key-env", "MY_KEY", env=_env(MY_KEY=SECRET),
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)  # the whole of stdout
    assert doc["completed"] == 8 and doc["prompts"] == ["one", "two"] and len(doc["measurements"]) == 8
    assert [t["label"] for t in doc["targets"]] == ["A", "B"]
    assert err.count("compare ") == 8 and "compare 8/8: " in err  # progress: plain lines, on stderr
    assert SECRET not in out + err
    root = ET.fromstring(plot.read_text("utf-8"))  # well-formed XML
    assert root.tag == SVG_NS + "svg"
    dots = [c for c in root.iter(SVG_NS + "circle") if c.find(SVG_NS + "title") is not None]
    with_tpot = sum(1 for m in doc["measurements"] if m["tpot_s"] is not None)
    assert len(dots) == 8 + with_tpot
    assert SECRET not in plot.read_text("utf-8")


async def test_thresholds_turn_a_certain_but_small_difference_into_none_that_matters(
    sims: tuple[SimRunning, SimRunning], tmp_path: Path
) -> None:
    """B is twice as fast; with a 10 s absolute threshold for whole-request durations, TTFT's
    ~15 ms is certain but does not matter, while TPOT (per token, its own threshold) still does."""
    slow, fast = sims
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"name": p.name, "messages": list(p.turns)}) for p in PROMPTS) + "\n", "utf-8"
    )
    code, out, err = await _cli(
        "--base-url", slow.base_url, "--base-url", fast.base_url, "--prompts", str(prompts), "--runs", "3",
        "--max-tokens", "8", "--json", "--min-diff-ms", "10000",
        env=_env(TAOTRACE_API_KEY=SECRET, TAOTRACE_MIN_DIFF_PERCENT="20"),
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["thresholds"] == {"duration_s": 10.0, "per_token_s": 0.0005, "relative": 0.2}
    ttft = doc["differences"]["ttft_s"]
    assert ttft["significant"] and ttft["faster"] == "B", ttft  # more than noise...
    assert (ttft["verdict"], ttft["matters"], ttft["absolute"]["passed"]) == ("below_threshold", False, False)
    assert ttft["relative"]["passed"] and ttft["absolute"]["threshold_s"] == 10.0  # ...but far under 10 s
    for key in ("tpot_s", "tokens_per_s"):
        d = doc["differences"][key]
        assert (d["verdict"], d["faster"], d["matters"]) == ("faster", "B", True), (key, d)
        assert d["absolute"]["threshold_s"] == 0.0005 and d["absolute"]["per_token"] and d["absolute"]["passed"]
    report = text(doc)  # the table is drawn from this same document
    assert re.search(r"\nTTFT .* no difference that matters \(B \d\.\d\dx faster, under 10000 ms\)\n", report), report
    assert re.search(r"\nTPOT .* B faster, \d\.\d\dx\n", report), report
    assert "\nTTFT: no difference that matters (A " in report and "\nTPOT: B is faster (A " in report


async def test_a_wrong_key_fails_the_warm_up_without_showing_the_key(sims: tuple[SimRunning, SimRunning]) -> None:
    slow, fast = sims
    wrong = "sk-wrong-key-77aa41"
    code, out, err = await _cli(
        "--base-url", slow.base_url, "--base-url", fast.base_url, "--runs", "1", env=_env(TAOTRACE_API_KEY=wrong)
    )  # fmt: skip
    assert code == 1 and out == ""
    assert "A (" in err and "failed its warm-up request: HTTP 401" in err
    assert wrong not in err and SECRET not in err


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["sigint", "sigterm"])
async def test_ctrl_c_prints_what_was_measured_and_exits_130(
    sims: tuple[SimRunning, SimRunning], sig: int, status: int
) -> None:
    """Ctrl-C (or SIGTERM: exit 143) prints what was measured, as probe and doctor do."""
    slow, fast = sims
    code, out, err = await _cli(
        "--base-url", slow.base_url, "--base-url", fast.base_url, "--runs", "50", "--max-tokens", "4",
        env=_env(TAOTRACE_API_KEY=SECRET), stop_after="compare 4/", sig=sig,
    )  # fmt: skip
    assert code == status, err
    assert "Traceback" not in err
    assert re.search(r"taotrace compare: interrupted after \d+ of 500 requests\n", err), err
    assert out.startswith("compare 5 prompts x 50 runs")
    assert "interrupted: measured " in out and " of 500 requests" in out
    measured = int(out.split("interrupted: measured ")[1].split()[0])
    assert 4 <= measured < 500
    assert "TTFT" in out


@pytest.mark.parametrize(
    "args,words",
    [
        (["--base-url", "http://127.0.0.1:9/v1"], "give two targets"),
        (["--base-url", "http://a.test,http://b.test", "--prompts", "x", "--from-live", "http://c.test"], "give one"),
        (["--base-url", "http://a.test,http://b.test/v1/chat/completions"], "endpoint path"),
        (["--base-url", "http://a.test,http://b.test", "--min-diff-ms", "-1"], "argument --min-diff-ms: invalid"),
        (
            ["--base-url", "http://a.test,http://b.test", "--min-diff-percent", "100"],
            "allowed: a number >= 0 and < 100",
        ),
        (["--base-url", "http://a.test,http://b.test", "--min-tpot-diff-ms", "nan"], "argument --min-tpot-diff-ms"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TAOTRACE_BASE_URL", raising=False)
    assert main(["compare", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and words in err and len(err.strip().splitlines()) == 1


def test_a_bad_prompts_file_is_one_clear_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": 3}\n', "utf-8")
    assert main(["compare", "--base-url", "http://a.test,http://b.test", "--prompts", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"taotrace compare: error: {bad} line 2: 'prompt' must be a string"
    assert main(["compare", "--base-url", "http://a.test,http://b.test", "--prompts", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "cannot read --prompts" in err and "No such file" in err


# --- prompts from a running proxy's live view ------------------------------------------------------


async def _send(client: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with client.post(url, json=body) as response:
        assert response.status == 200
        await response.read()


async def test_from_live_reads_the_captured_input_of_recent_requests(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy(capture_content=True, ui_token="ui-secret") as p:
        p.serve(stream_handler(chat_stream(3)))
        chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is RTT?"}]
        await _send(client, p.url + "/v1/chat/completions", {"model": "m", "stream": True, "messages": chat})
        await _send(client, p.url + "/v1/chat/completions", {"model": "m", "stream": True, "messages": chat})  # same
        await _send(client, p.url + "/v1/messages", {
            "model": "m", "stream": True, "max_tokens": 5, "system": "Sys", "messages": [{"role": "user", "content": "Hi"}]
        })  # fmt: skip
        await p.settled(3)
        async with aiohttp.ClientSession() as session:
            prompts = await live_prompts(session, p.metrics_url, "ui-secret", 10)
            with pytest.raises(LiveError, match="--ui-token"):
                await live_prompts(session, p.metrics_url, "wrong", 10)
    assert len(prompts) == 2  # the repeated input once, newest first
    assert prompts[0].system == "Sys" and prompts[0].turns == ({"role": "user", "content": "Hi"},)
    assert prompts[1].system == "Be brief." and prompts[1].turns == ({"role": "user", "content": "What is RTT?"},)
    assert all(p.name.startswith("live-") for p in prompts)


async def test_without_capture_the_live_view_holds_no_input(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy() as p:
        p.serve(stream_handler(chat_stream(3)))
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "private words"}]}
        await _send(client, p.url + "/v1/chat/completions", body)
        await p.settled(1)
        async with client.get(p.metrics_url + "/api/requests") as response:
            rows = (await response.json())["requests"]
        async with client.get(p.metrics_url + f"/api/requests/{rows[0]['id']}") as response:
            assert "private words" not in await response.text()
        async with aiohttp.ClientSession() as session:
            with pytest.raises(LiveError, match="--capture-content"):
                await live_prompts(session, p.metrics_url, None, 10)


def test_the_documented_prompts_file_and_its_error_are_real() -> None:
    page = (ROOT / "docs" / "compare.md").read_text()
    block = page.split("```jsonl\n", 1)[1].split("```", 1)[0]
    assert [p.name for p in parse_jsonl(block, "prompts.jsonl")] == ["line-1", "support", "line-3", "line-4"]
    lines = block.splitlines()
    lines[2] = lines[2].replace('"system"', '"promt"', 1)
    with pytest.raises(PromptError) as caught:
        parse_jsonl("\n".join(lines), "prompts.jsonl")
    assert f"taotrace compare: error: {caught.value}\n" in page
