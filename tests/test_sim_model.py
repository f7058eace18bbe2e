"""The simulator's pure parts: timing model, KV cache, scheduler, tokens, request parsing, catalogue."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.sim.catalogue import DEFAULT_CATALOGUE, ModelSpec, catalogue_from
from proxy.sim.errors import SimError
from proxy.sim.kvcache import KVCache
from proxy.sim.physics import Physics
from proxy.sim.request import parse_request
from proxy.sim.scheduler import Scheduler, Sequence
from proxy.sim.text import plan_output
from proxy.sim.tokens import EstimateTokenizer, load_tokenizer

MODELS = {spec.name: spec for spec in DEFAULT_CATALOGUE}
MINI, BIG, REASONER = MODELS["gpt-4o-mini"], MODELS["gpt-4o"], MODELS["o3-mini"]


# --- physics -------------------------------------------------------------------------------


def test_prefill_grows_linearly_plus_a_small_quadratic_term() -> None:
    p = Physics()
    t1, t2, t4 = (p.prefill_seconds(MINI, n) - MINI.prefill_base_s for n in (1000, 2000, 4000))
    assert 2.0 < t2 / t1 < 2.2  # mostly linear ...
    assert t4 / t2 > t2 / t1  # ... and superlinear: attention is quadratic


def test_a_cached_prefix_skips_most_of_its_prefill() -> None:
    p = Physics()
    cold = p.prefill_seconds(MINI, 4096, 0)
    warm = p.prefill_seconds(MINI, 16, 4080)
    assert warm < 0.25 * cold
    assert warm > p.prefill_seconds(MINI, 16, 0)  # the residual: not quite free


def test_decode_depends_on_model_size_and_batch_not_input() -> None:
    p = Physics()
    assert p.decode_step_seconds(BIG, 1) > 2 * p.decode_step_seconds(MINI, 1)
    one, eight = p.decode_step_seconds(MINI, 1), p.decode_step_seconds(MINI, 8)
    assert 1.0 < eight / one < 1.5  # continuous batching: gently slower
    assert p.decode_step_seconds(MINI, 0) == 0.0


def test_kv_bytes_per_token_follow_the_shape() -> None:
    assert MINI.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert BIG.kv_bytes_per_token == 320 * 1024


# --- KV cache ------------------------------------------------------------------------------


def test_allocation_reserves_output_and_release_keeps_full_prompt_blocks_cached() -> None:
    kv = KVCache(total_blocks=10, block_size=4)
    alloc = kv.allocate(list(range(10)), max_new_tokens=6)  # 10 prompt tokens: 3 blocks, 4 in all
    assert alloc is not None and alloc.cached_tokens == 0
    s = kv.stats()
    assert (s.used_blocks, s.reserved_blocks, s.free_blocks) == (3, 1, 7)
    for _ in range(6):
        kv.append(alloc)
    assert kv.stats().used_blocks == 4 and kv.stats().reserved_blocks == 0
    kv.release(alloc)
    s = kv.stats()
    assert (s.used_blocks, s.cached_blocks, s.free_blocks) == (0, 2, 8)  # 2 full prompt blocks stay


def test_a_repeated_prefix_reuses_blocks_but_always_computes_one_token() -> None:
    kv = KVCache(total_blocks=16, block_size=4)
    prompt = list(range(12))
    first = kv.allocate(prompt, 1)
    assert first is not None
    kv.release(first)
    again = kv.allocate(prompt, 1)
    assert again is not None and again.cached_tokens == 8  # 3 full blocks match; the last is recomputed
    longer = kv.allocate(prompt + [99, 98], 1)
    assert longer is not None and longer.cached_tokens == 12  # shared while `again` still runs
    other = kv.allocate([7] + prompt, 1)
    assert other is not None and other.cached_tokens == 0  # a different first block: no match


def test_full_pool_refuses_then_evicts_least_recently_used_cached_blocks() -> None:
    kv = KVCache(total_blocks=4, block_size=2)
    a = kv.allocate([1, 2, 3, 4], 3)  # 4 prompt tokens + 3 new: 4 blocks
    assert a is not None
    assert kv.allocate([5, 6], 1) is None  # nothing left
    kv.release(a)
    assert kv.stats().cached_blocks == 2
    b = kv.allocate([5, 6, 7, 8, 9, 10], 1)  # 3 blocks now + 1 promised: evicts the older cached one
    assert b is not None and kv.stats().cached_blocks == 1 and kv.available() == 0
    kv.release(b)
    c = kv.allocate([1, 2, 3, 4], 1)
    assert c is not None and c.cached_tokens == 0  # its first block was evicted: no prefix left
    assert not kv.fits_ever(9)


# --- scheduler -----------------------------------------------------------------------------


def _seq(name: str, prompt: int, new: int) -> Sequence:
    start = ord(name[0]) * 100_000  # distinct prompts: no accidental prefix sharing
    return Sequence(id=name, prompt=list(range(start, start + prompt)), max_new=new, submitted_at=0.0)


def test_running_sequences_share_each_decode_step() -> None:
    physics = Physics()
    sched = Scheduler(MINI, KVCache(1024, 16), physics)
    a, b = _seq("a", 100, 3), _seq("b", 200, 2)
    sched.submit(a)
    step = sched.plan(0.0)
    assert step is not None and step.admitted == (a,) and step.decode_s == 0.0
    assert step.prefill_s == pytest.approx(physics.prefill_seconds(MINI, 100))
    assert sched.commit(step, 1.0) == [a] and a.produced == 1 and a.first_token_at == 1.0
    sched.submit(b)
    step = sched.plan(1.0)
    assert step is not None and step.admitted == (b,) and step.decoding == (a,)
    assert step.duration == pytest.approx(physics.prefill_seconds(MINI, 200) + physics.decode_step_seconds(MINI, 1))
    sched.commit(step, 2.0)
    step = sched.plan(2.0)
    assert step is not None and step.decoding == (a, b)
    assert step.decode_s == pytest.approx(physics.decode_step_seconds(MINI, 2))
    done = sched.commit(step, 3.0)
    assert {s.id for s in done} == {"a", "b"} and a.state == b.state == "done"
    assert sched.plan(3.0) is None and sched.kv.stats().used_blocks == 0


def test_admission_waits_for_kv_blocks_and_abort_frees_them() -> None:
    sched = Scheduler(MINI, KVCache(4, 4), Physics())
    a, b = _seq("a", 8, 8), _seq("b", 4, 4)  # a takes all 4 blocks
    sched.submit(a)
    sched.submit(b)
    step = sched.plan(0.0)
    assert step is not None and step.admitted == (a,) and sched.waiting == 1
    sched.abort(a)
    assert a.state == "aborted"
    assert sched.commit(step, 1.0) == []  # the aborted sequence produces nothing
    step = sched.plan(1.0)
    assert step is not None and step.admitted == (b,)
    with pytest.raises(ValueError):
        sched.submit(_seq("huge", 100, 1))


def test_max_batch_caps_the_running_set() -> None:
    sched = Scheduler(MINI, KVCache(1024, 16), Physics(), max_batch=2)
    for name in "abc":
        sched.submit(_seq(name, 10, 5))
    step = sched.plan(0.0)
    assert step is not None and len(step.admitted) == 2 and sched.waiting == 1


# --- tokens and text ---------------------------------------------------------------------


def test_estimate_tokenizer_is_documented_and_deterministic() -> None:
    tok = EstimateTokenizer()
    assert tok.pieces("Hello, world!") == ["Hello", ",", " world", "!"]
    assert tok.pieces(" tokenizer") == [" tokeni", "zer"]  # 6 letters a token
    assert tok.pieces("12345") == ["123", "45"]
    assert tok.pieces("你好") == ["你", "好"]
    assert tok.pieces("<|im_start|>user") == ["<|im_start|>", "user"]
    text = "The quick brown fox jumps over the lazy dog. " * 20
    assert tok.encode(text) == tok.encode(text)
    words = len(text.split())
    assert 1.0 <= len(tok.encode(text)) / words <= 1.6
    assert load_tokenizer("estimate").name == "estimate"
    assert load_tokenizer("auto").encode("hi")  # tiktoken when it loads offline, else the estimate


def test_reasoning_models_think_first_and_limits_cut_the_output() -> None:
    out = plan_output(REASONER, max_tokens=None, effort=None, seed="s")
    assert len(out.reasoning) == REASONER.reasoning_tokens and len(out.answer) == REASONER.natural_output_tokens
    assert out.finish == "stop"
    low = plan_output(REASONER, max_tokens=None, effort="low", seed="s")
    assert len(low.reasoning) == REASONER.reasoning_tokens // 2
    capped = plan_output(MINI, max_tokens=5, effort=None, seed="s")
    assert capped.total == 5 and capped.finish == "length" and capped.reasoning == ()
    tight = plan_output(REASONER, max_tokens=3, effort=None, seed="s")
    assert (len(tight.reasoning), len(tight.answer)) == (2, 1)
    assert plan_output(MINI, max_tokens=50, effort=None, seed="x") == plan_output(
        MINI, max_tokens=50, effort=None, seed="x"
    )


def test_a_limit_is_the_output_length_up_to_the_model_s_cap() -> None:
    natural = plan_output(MINI, max_tokens=None, effort=None, seed="s")
    assert natural.total == MINI.natural_output_tokens == 96 and natural.finish == "stop"
    asked = plan_output(MINI, max_tokens=1000, effort=None, seed="s")
    assert asked.total == 1000 and asked.finish == "length" and len(asked.text.split()) > 500
    over = plan_output(MINI, max_tokens=MINI.max_output_tokens + 1, effort=None, seed="s")
    assert over.total == MINI.max_output_tokens == 4096 and over.finish == "stop"
    thinker = plan_output(REASONER, max_tokens=300, effort="high", seed="s")
    assert (len(thinker.reasoning), len(thinker.answer)) == (2 * REASONER.reasoning_tokens, 300 - 128)


# --- request parsing -----------------------------------------------------------------------


def test_each_dialect_parses_to_one_request() -> None:
    chat = parse_request(
        "chat_completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_completion_tokens": 7,
        },
        {},
    )
    assert chat.prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert (chat.stream, chat.include_usage, chat.max_tokens) == (True, True, 7)
    legacy = parse_request("completions", {"model": "m", "prompt": "once"}, {})
    assert legacy.prompt == "once" and legacy.max_tokens == 16  # the legacy default
    resp = parse_request(
        "responses", {"model": "m", "input": "hi", "instructions": "be brief", "reasoning": {"effort": "high"}}, {}
    )
    assert resp.prompt.startswith("<|im_start|>system\nbe brief") and resp.reasoning_effort == "high"
    msg = parse_request(
        "messages",
        {"model": "m", "system": "sys", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
        {},
    )
    assert msg.prompt.startswith("<|im_start|>system\nsys") and msg.max_tokens == 3


@pytest.mark.parametrize(
    ("api", "body"),
    [
        ("chat_completions", {"messages": []}),
        ("chat_completions", {"model": "m"}),
        ("chat_completions", {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
        ("messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]}),  # max_tokens is required
        ("completions", {"model": "m", "prompt": 5}),
        ("chat_completions", {"model": "m", "messages": [{"role": "user", "content": "[sim:nonsense]"}]}),
    ],
)
def test_what_a_provider_rejects_is_a_400(api: str, body: dict[str, object]) -> None:
    with pytest.raises(SimError) as info:
        parse_request(api, body, {})
    assert info.value.status == 400


def test_failure_triggers_come_from_a_header_or_a_prompt_marker() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "go [sim:midstream] now"}]}
    assert parse_request("chat_completions", body, {}).failure == "midstream"
    plain = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
    assert parse_request("chat_completions", plain, {"x-sim-fail": "cut"}).failure == "cut"
    assert parse_request("chat_completions", plain, {}).failure is None


def test_a_catalogue_file_overrides_and_adds_models() -> None:
    specs = catalogue_from(
        {"models": [{"name": "gpt-4o", "decode_per_token_s": 0.05}, {**dataclasses.asdict(MINI), "name": "tiny"}]}
    )
    by_name = {s.name: s for s in specs}
    assert by_name["gpt-4o"].decode_per_token_s == 0.05 and by_name["gpt-4o"].layers == 80
    assert isinstance(by_name["tiny"], ModelSpec) and len(specs) == len(DEFAULT_CATALOGUE) + 1
    with pytest.raises(ValueError):
        catalogue_from({"models": [{"name": "x", "bogus": 1}]})


def test_a_long_answer_reads_as_sentences_where_the_paragraph_starts_again() -> None:
    """An answer longer than the text it is drawn from goes round it: the word after the last
    full stop keeps its space."""
    import re

    from proxy.sim.text import plan_output

    spec = DEFAULT_CATALOGUE[0]
    out = plan_output(spec, max_tokens=min(400, spec.max_output_tokens), effort="minimal", seed="x")
    assert out.answer and not re.search(r"[.,;:][A-Za-z]", out.text), out.text
