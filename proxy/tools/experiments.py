"""The seed article's three experiments, as data: what to send, and how to read the results.

Pure: `plan()` builds the runs, `RunResult` pairs the client's measurement with the proxy's
record of the same request, `to_json()` / `format_report()` turn results into the demo's output.

- `input_length`: one request, then its input doubled (1x, 2x, 4x): TTFT rises, TPOT stays flat.
- `prefix_cache`: one prompt three times: the repeats skip most of the prefill.
- `model_size`: the small model, then the large one on the same prompt: TTFT and TPOT both rise.
- `reasoning`: the article's reasoning model, which streams its thinking, and one that hides it:
  the article's client (TTFT at the first content, `proxy.tools.article`) beside the proxy's first
  token, thinking (measured, or estimated when hidden) and the answer's first token.

Every prompt starts with a fresh nonce, so no run hits a prefix cached by another.
"""

from __future__ import annotations

import secrets
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.exchange.record import RequestRecord
from proxy.sim.tokens import EstimateTokenizer
from proxy.tools.client import Measurement
from proxy.tools.table import align, cell

__all__ = [
    "COLUMNS", "EXPERIMENTS", "REASONING_COLUMNS", "Experiment", "Run", "RunResult", "format_report", "plan",
    "plot_json", "summaries", "to_json",
]  # fmt: skip

EXPERIMENTS = ("input_length", "prefix_cache", "model_size", "reasoning")
# The table's columns and the `--json` key of each (JSON in seconds and bytes; the table in ms and
# MiB). `experiment` is the name of the run's group in the JSON.
COLUMNS = (
    ("experiment", "experiment"), ("run", "label"), ("in tok", "input_tokens"), ("cached", "cached_tokens"),
    ("TTFT", "ttft_s"), ("total", "total_s"), ("out", "output_tokens"), ("TPOT", "tpot_s"),
    ("tok/s", "tokens_per_s"), ("proxy TTFT", "proxy_ttft_s"), ("network", "network_s"),
    ("prefill_wait", "prefill_wait_s"), ("decode", "decode_s"), ("KV MiB", "kv_bytes"),
)  # fmt: skip
# The reasoning runs' own table: the article's TTFT (first content) beside the proxy's first token,
# its thinking (measured when streamed, estimated when hidden) and the answer's first token.
REASONING_COLUMNS = (
    ("run", "label"), ("article TTFT", "article_ttft_s"), ("proxy TTFT", "proxy_ttft_s"),
    ("thinking", "thinking_s"), ("proxy answer", "proxy_answer_ttft_s"), ("~hidden thinking", "thinking_estimated_s"),
    ("reasoning tok", "reasoning_tokens"), ("reasoning tok/s", "reasoning_tokens_per_s"),
    ("answer tok/s", "answer_tokens_per_s"),
)  # fmt: skip

# repeated to reach the sizes asked for (counted with the simulator's documented estimate)
_PARAGRAPH = (
    "An inference server first tokenizes the prompt, then runs the prefill: one pass of the model "
    "over every input token, which fills the KV cache and yields the first output token. Then it "
    "decodes, one token per step, each step reading the weights and the cache again. The queue, "
    "the prefill and the network all happen before the first token; the decode happens after it. "
)
_TOKENS_PER_PARAGRAPH = len(EstimateTokenizer().encode(_PARAGRAPH))
_QUESTION = "Where does the time of an LLM request go before its first token? Think it through, then answer briefly."


@dataclass(frozen=True, slots=True)
class Run:
    """One request of an experiment."""

    experiment: str
    label: str
    model: str
    prompt: str

    @property
    def reasoning(self) -> bool:
        return self.experiment == "reasoning"


@dataclass(frozen=True, slots=True)
class Experiment:
    """A named list of runs, made one after another."""

    name: str
    runs: tuple[Run, ...]


def _prompt(tokens: int, nonce: str) -> str:
    repeats = max(1, round(tokens / _TOKENS_PER_PARAGRAPH))
    return f"Request {nonce}. Summarise the following in one paragraph.\n\n" + _PARAGRAPH * repeats


def plan(
    small_model: str,
    large_model: str,
    *,
    base_tokens: int = 1000,
    doublings: int = 2,
    cache_tokens: int = 4000,
    nonce: str | None = None,
    reasoning_models: tuple[str, ...] = (),
) -> tuple[Experiment, ...]:
    """The experiments. `doublings` = 2 gives 1x, 2x, 4x; `reasoning_models` (none: no
    `reasoning` experiment) each answer one short question."""
    nonce = nonce or secrets.token_hex(4)
    sizes = [base_tokens * 2**i for i in range(doublings + 1)]
    input_length = tuple(
        Run("input_length", f"{2**i}x", small_model, _prompt(size, f"{nonce}-len{i}")) for i, size in enumerate(sizes)
    )
    cached = _prompt(cache_tokens, f"{nonce}-cache")
    prefix_cache = tuple(Run("prefix_cache", label, small_model, cached) for label in ("first", "repeat 1", "repeat 2"))
    same = _prompt(base_tokens * 2, f"{nonce}-size")
    model_size = (Run("model_size", small_model, small_model, same), Run("model_size", large_model, large_model, same))
    experiments = (
        Experiment("input_length", input_length),
        Experiment("prefix_cache", prefix_cache),
        Experiment("model_size", model_size),
    )
    if not reasoning_models:
        return experiments
    question = f"Request {nonce}-think. " + _QUESTION
    return (*experiments, Experiment("reasoning", tuple(Run("reasoning", m, m, question) for m in reasoning_models)))


@dataclass(frozen=True, slots=True)
class RunResult:
    """What the client measured, what the proxy recorded, and the upstream's KV bytes when known."""

    run: Run
    client: Measurement
    record: RequestRecord | None
    kv_bytes: int | None = None
    article_ttft_s: float | None = None  # the article's client code: the first chunk with content

    def to_json(self) -> dict[str, Any]:
        timing = self.record.timing if self.record is not None else None
        common = {
            "label": self.run.label,
            "model": self.run.model,
            "input_tokens": self.client.input_tokens,
            "cached_tokens": self.client.cached_tokens,
            "ttft_s": self.client.ttft_s,
            "total_s": self.client.total_s,
            "output_tokens": self.client.output_tokens,
            "tpot_s": self.client.tpot_s,
            "tokens_per_s": self.client.tokens_per_s,
            "proxy_ttft_s": timing.ttft if timing else None,
            "network_s": timing.network if timing else None,
            "prefill_wait_s": timing.prefill_wait if timing else None,
            "decode_s": timing.decode if timing else None,
            "kv_bytes": self.kv_bytes,  # the upstream's KV cache at this request's peak (simulator only)
        }
        if not self.run.reasoning:
            return common
        c = self.client
        return {
            **common,
            "article_ttft_s": self.article_ttft_s,
            "answer_ttft_s": c.answer_ttft_s,  # the measurement client's first answer token
            "proxy_answer_ttft_s": timing.time_to_first_answer_token if timing else None,
            "thinking_s": timing.thinking if timing else None,  # measured: streamed reasoning
            "thinking_estimated_s": timing.thinking_estimated if timing else None,  # hidden: an estimate
            "reasoning_tokens": c.reasoning_tokens,
            "reasoning_tokens_per_s": c.reasoning_tokens_per_s,
            "answer_tokens_per_s": c.answer_tokens_per_s,
        }


def to_json(results: Sequence[RunResult]) -> dict[str, Any]:
    """`{"experiments": [{"name", "runs": [...]}]}` in experiment order."""
    return {
        "experiments": [
            {"name": name, "runs": [r.to_json() for r in results if r.run.experiment == name]}
            for name in EXPERIMENTS
            if any(r.run.experiment == name for r in results)
        ]
    }


def plot_json(results: Sequence[RunResult], report: str) -> dict[str, Any]:
    """What the live view plots: each run as the proxy recorded it (the spans' numbers), by trace id."""
    runs = []
    for r in results:
        rec = r.record
        runs.append(
            {
                "experiment": r.run.experiment,
                "label": r.run.label,
                "model": r.run.model,
                "trace_id": rec.trace_id if rec else None,
                "input_tokens": rec.usage.input_tokens if rec else None,
                "cached_input_tokens": rec.usage.cached_input_tokens if rec else None,
                "ttft_s": rec.timing.ttft if rec else None,
                "tpot_s": rec.timing.tpot if rec else None,
            }
        )
    return {"runs": runs, "report": report}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _x(value: float | None) -> str:
    return "?" if value is None else f"x{value:.2f}"


def summaries(results: Sequence[RunResult]) -> list[str]:
    """One line per experiment saying what it shows, with the ratios measured."""
    by = {name: [r for r in results if r.run.experiment == name] for name in EXPERIMENTS}
    lines = []
    if len(runs := by["input_length"]) >= 2:
        a, b = runs[0].client, runs[-1].client
        lines.append(
            f"input_length: input {_x(_ratio(b.input_tokens, a.input_tokens))} -> TTFT {_x(_ratio(b.ttft_s, a.ttft_s))}, "
            f"TPOT {_x(_ratio(b.tpot_s, a.tpot_s))} (prefill grows with the input; decode does not)"
        )
    if len(runs := by["prefix_cache"]) >= 2:
        first = runs[0].client
        repeats = [r.client.ttft_s for r in runs[1:] if r.client.ttft_s is not None]
        repeat = statistics.median(repeats) if repeats else None
        cached = runs[-1].client.cached_tokens
        lines.append(
            f"prefix_cache: repeats' TTFT = {_x(_ratio(repeat, first.ttft_s))} the first "
            f"({cached if cached is not None else '?'} of {runs[-1].client.input_tokens} input tokens cached)"
        )
    if len(runs := by["model_size"]) >= 2:
        a, b = runs[0].client, runs[-1].client
        lines.append(
            f"model_size: {runs[-1].run.model} vs {runs[0].run.model}: TTFT {_x(_ratio(b.ttft_s, a.ttft_s))}, "
            f"TPOT {_x(_ratio(b.tpot_s, a.tpot_s))}"
        )
    lines += _reasoning_lines(by["reasoning"])
    gaps = [
        abs(r.client.ttft_s - r.record.timing.ttft)
        for r in results
        if r.record and r.record.timing.ttft is not None and r.client.ttft_s is not None
    ]
    if gaps:
        lines.append(f"client vs proxy TTFT: max |difference| {max(gaps) * 1000:.1f} ms over {len(gaps)} runs")
    # The experiments' long prompts: a reasoning run's short question rounds up to whole blocks
    kv = [r for r in results if r.kv_bytes and r.client.input_tokens is not None and not r.run.reasoning]
    if kv:
        top = max(kv, key=lambda r: r.kv_bytes or 0)
        per_token: dict[str, float] = {}
        for r in kv:  # peak bytes over the tokens held (prompt + output), whole blocks included
            per_token.setdefault(
                r.run.model, (r.kv_bytes or 0) / ((r.client.input_tokens or 0) + r.client.output_tokens)
            )
        each = ", ".join(f"{model} ~{size / 1024:.0f} KiB" for model, size in per_token.items())
        lines.append(
            f"KV cache (who ate the GPU memory): {top.run.experiment} {top.run.label} held "
            f"{(top.kv_bytes or 0) / 2**20:.0f} MiB while it ran; per token: {each}"
        )
    return lines


def _reasoning_lines(runs: Sequence[RunResult]) -> list[str]:
    """What the reasoning runs show: the article's TTFT is the answer's first token, not the first."""
    lines = []
    for r in runs:
        t = r.record.timing if r.record else None
        name = r.run.model
        if t is None or t.ttft is None:
            continue
        if t.thinking is not None:
            lines.append(
                f"reasoning: {name}'s article TTFT {_ms(r.article_ttft_s)} ms is its first answer token "
                f"(proxy {_ms(t.time_to_first_answer_token)} ms), after {_ms(t.thinking)} ms of streamed thinking"
            )
        elif t.thinking_estimated is not None and t.prefill_wait:
            lines.append(
                f"reasoning: {name} hid its thinking ({r.client.reasoning_tokens} tokens): ~{_ms(t.thinking_estimated)} ms "
                f"of its {_ms(t.prefill_wait)} ms prefill_wait, estimated, not measured"
            )
        else:
            lines.append(f"reasoning: {name} showed no reasoning (none streamed, none reported)")
    return lines


def _ms(value: float | None) -> str:
    return cell(value, 1, 1000)


def _reasoning_table(results: Sequence[RunResult]) -> list[str]:
    """The reasoning runs' own table, after the main one (empty without them)."""
    runs = [r for r in results if r.run.reasoning]
    if not runs:
        return []
    rows = [tuple(header for header, _ in REASONING_COLUMNS)]
    for r in runs:
        c, t = r.client, (r.record.timing if r.record else None)
        rows.append(
            (
                r.run.label, _ms(r.article_ttft_s), _ms(t.ttft if t else None), _ms(t.thinking if t else None),
                _ms(t.time_to_first_answer_token if t else None), _ms(t.thinking_estimated if t else None),
                cell(c.reasoning_tokens), cell(c.reasoning_tokens_per_s, 1), cell(c.answer_tokens_per_s, 1),
            )
        )  # fmt: skip
    return ["", *align(rows, left=1, rule=True)]


def format_report(results: Sequence[RunResult]) -> str:
    """The demo's table (times in ms), the reasoning runs' own table, and the summary lines."""
    rows = [tuple(header for header, _ in COLUMNS)]
    for r in results:
        c, t = r.client, (r.record.timing if r.record else None)
        rows.append(
            (
                r.run.experiment, r.run.label, cell(c.input_tokens), cell(c.cached_tokens), _ms(c.ttft_s),
                _ms(c.total_s), str(c.output_tokens), _ms(c.tpot_s), cell(c.tokens_per_s, 1),
                _ms(t.ttft if t else None), _ms(t.network if t else None), _ms(t.prefill_wait if t else None),
                _ms(t.decode if t else None), cell(r.kv_bytes / 2**20 if r.kv_bytes else None, 1),
            )
        )  # fmt: skip
    notes = ["times in ms; client columns first, then the proxy's split of the same request"]
    if any(r.run.reasoning for r in results):
        notes.append(
            "reasoning: article TTFT = the article's client code (first content); ~ = hidden thinking, estimated"
        )
    return "\n".join([*align(rows, left=2, rule=True), *_reasoning_table(results), "", *notes, *summaries(results)])
