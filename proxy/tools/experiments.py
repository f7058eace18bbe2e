"""The seed article's three experiments, as data: what to send, and how to read the results.

Pure: `plan()` builds the runs, `RunResult` pairs the client's measurement with the proxy's
record of the same request, `to_json()` / `format_report()` turn results into the demo's output.

- `input_length`: one request, then its input doubled (1x, 2x, 4x): TTFT rises, TPOT stays flat.
- `prefix_cache`: one prompt three times: the repeats skip most of the prefill.
- `model_size`: the small model, then the large one on the same prompt: TTFT and TPOT both rise.

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
    "COLUMNS", "EXPERIMENTS", "Experiment", "Run", "RunResult", "format_report", "plan", "plot_json", "summaries",
    "to_json",
]  # fmt: skip

EXPERIMENTS = ("input_length", "prefix_cache", "model_size")
# The table's columns and the `--json` key of each (JSON in seconds and bytes; the table in ms and
# MiB). `experiment` is the name of the run's group in the JSON.
COLUMNS = (
    ("experiment", "experiment"), ("run", "label"), ("in tok", "input_tokens"), ("cached", "cached_tokens"),
    ("TTFT", "ttft_s"), ("total", "total_s"), ("out", "output_tokens"), ("TPOT", "tpot_s"),
    ("tok/s", "tokens_per_s"), ("proxy TTFT", "proxy_ttft_s"), ("network", "network_s"),
    ("prefill_wait", "prefill_wait_s"), ("decode", "decode_s"), ("KV MiB", "kv_bytes"),
)  # fmt: skip

# repeated to reach the sizes asked for (counted with the simulator's documented estimate)
_PARAGRAPH = (
    "An inference server first tokenizes the prompt, then runs the prefill: one pass of the model "
    "over every input token, which fills the KV cache and yields the first output token. Then it "
    "decodes, one token per step, each step reading the weights and the cache again. The queue, "
    "the prefill and the network all happen before the first token; the decode happens after it. "
)
_TOKENS_PER_PARAGRAPH = len(EstimateTokenizer().encode(_PARAGRAPH))


@dataclass(frozen=True, slots=True)
class Run:
    """One request of an experiment."""

    experiment: str
    label: str
    model: str
    prompt: str


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
) -> tuple[Experiment, ...]:
    """The three experiments. `doublings` = 2 gives 1x, 2x, 4x."""
    nonce = nonce or secrets.token_hex(4)
    sizes = [base_tokens * 2**i for i in range(doublings + 1)]
    input_length = tuple(
        Run("input_length", f"{2**i}x", small_model, _prompt(size, f"{nonce}-len{i}")) for i, size in enumerate(sizes)
    )
    cached = _prompt(cache_tokens, f"{nonce}-cache")
    prefix_cache = tuple(Run("prefix_cache", label, small_model, cached) for label in ("first", "repeat 1", "repeat 2"))
    same = _prompt(base_tokens * 2, f"{nonce}-size")
    model_size = (Run("model_size", small_model, small_model, same), Run("model_size", large_model, large_model, same))
    return (
        Experiment("input_length", input_length),
        Experiment("prefix_cache", prefix_cache),
        Experiment("model_size", model_size),
    )


@dataclass(frozen=True, slots=True)
class RunResult:
    """What the client measured, what the proxy recorded, and the upstream's KV bytes when known."""

    run: Run
    client: Measurement
    record: RequestRecord | None
    kv_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        timing = self.record.timing if self.record is not None else None
        return {
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
    gaps = [
        abs(r.client.ttft_s - r.record.timing.ttft)
        for r in results
        if r.record and r.record.timing.ttft is not None and r.client.ttft_s is not None
    ]
    if gaps:
        lines.append(f"client vs proxy TTFT: max |difference| {max(gaps) * 1000:.1f} ms over {len(gaps)} runs")
    kv = [r for r in results if r.kv_bytes and r.client.input_tokens is not None]
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


def _ms(value: float | None) -> str:
    return cell(value, 1, 1000)


def format_report(results: Sequence[RunResult]) -> str:
    """The demo's table (times in ms) and its summary lines."""
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
    note = "times in ms; client columns first, then the proxy's split of the same request"
    return "\n".join([*align(rows, left=2, rule=True), "", note, *summaries(results)])
