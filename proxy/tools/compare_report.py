"""What `taotrace compare` prints: the result as one JSON document, and that document as text. Pure.

`result(...)` computes everything once (spreads per target, paired differences with their
intervals and verdicts (`compare_verdict`), medians per prompt, every measurement); `text(doc)`
lays the same numbers out side by side, so `--json` and the table never disagree.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.tools.client import ms
from proxy.tools.compare_plan import LABELS, METRICS, REASONING_KEYS, Metric, Sample, pairs_of, values_of
from proxy.tools.compare_prompts import Prompt
from proxy.tools.compare_stats import MIN_PAIRS, Difference, median, paired_difference, spread
from proxy.tools.compare_verdict import Thresholds, decide
from proxy.tools.table import align, cell

__all__ = ["NOTED", "TargetInfo", "result", "text"]

NOTED = ("ttft_s", "tpot_s", "tokens_per_s")  # the metrics that get a sentence under the table
_PER_PROMPT = ("ttft_s", "tpot_s")


@dataclass(frozen=True, slots=True)
class TargetInfo:
    """One side of the comparison as it may be shown: a URL fit to print, the model."""

    base_url: str
    model: str


def _difference(diff: Difference | None, metric: Metric, thresholds: Thresholds) -> dict[str, Any] | None:
    if diff is None:
        return None
    decision = decide(diff, metric, thresholds)
    return {
        "pairs": diff.pairs,
        "median_a": diff.median_a,
        "median_b": diff.median_b,
        "diff": diff.diff,
        "ci_low": diff.low,
        "ci_high": diff.high,
        "level": diff.level,
        "resamples": diff.resamples,
        "significant": diff.significant,
        "enough_pairs": diff.enough,
        "faster": decision.faster,
        "ratio": diff.ratio,
        "absolute": {
            "diff_s": decision.size_s,
            "threshold_s": decision.min_size_s,
            "per_token": metric.per_token,
            "passed": decision.above_absolute,
        },
        "relative": {"diff": decision.share, "threshold": decision.min_share, "passed": decision.above_relative},
        "matters": decision.matters,
        "verdict": decision.verdict,
    }


def _measurement(s: Sample, prompts: Sequence[Prompt]) -> dict[str, Any]:
    m = s.measurement
    return {
        "target": LABELS[s.step.target],
        "prompt": prompts[s.step.prompt].name,
        "round": s.step.round + 1,
        "status": m.status,
        "ttft_s": m.ttft_s,
        "answer_ttft_s": m.answer_ttft_s,
        "thinking_s": m.thinking_s,
        "thinking_estimated_s": m.thinking_estimated_s,
        "tpot_s": m.tpot_s,
        "tokens_per_s": m.tokens_per_s,
        "total_s": m.total_s,
        "network_s": m.network_s,
        "rtt_s": m.rtt_s,
        "connect_s": m.connect_s,
        "output_tokens": m.output_tokens,
        "input_tokens": m.input_tokens,
        "cached_tokens": m.cached_tokens,
        "error": m.error,
    }


def result(
    *,
    targets: Sequence[TargetInfo],
    api: str,
    prompts: Sequence[Prompt],
    rounds: int,
    order: str,
    samples: Sequence[Sample],
    planned: int,
    interrupted: bool,
    rng: random.Random,
    thresholds: Thresholds,
) -> dict[str, Any]:
    """The whole comparison as JSON-able values."""
    by_key = {m.key: m for m in METRICS}
    summary: dict[str, Any] = {}
    for t, label in enumerate(LABELS):
        summary[label] = {}
        for metric in METRICS:
            found = spread(values_of(samples, t, metric))
            summary[label][metric.key] = None if found is None else {"n": found.n, "p50": found.p50, "p95": found.p95}
    differences = {m.key: _difference(paired_difference(pairs_of(samples, m), rng), m, thresholds) for m in METRICS}
    per_prompt = []
    for p, prompt in enumerate(prompts):
        row: dict[str, Any] = {"prompt": prompt.name}
        for t, label in enumerate(LABELS):
            mine = [s for s in samples if s.step.prompt == p]
            row[label] = {}
            for key in _PER_PROMPT:
                values = values_of(mine, t, by_key[key])
                row[label][key] = median(values) if values else None
        per_prompt.append(row)
    failed = [s for s in samples if not s.measurement.ok]
    return {
        "targets": [
            {"label": label, "base_url": info.base_url, "model": info.model}
            for label, info in zip(LABELS, targets, strict=True)
        ],
        "api": api,
        "prompts": [p.name for p in prompts],
        "runs": rounds,
        "order": order,
        "thresholds": {
            "duration_s": thresholds.duration_s,
            "per_token_s": thresholds.per_token_s,
            "relative": thresholds.relative,
        },
        "planned": planned,
        "completed": len(samples),
        "interrupted": interrupted,
        "failed": {label: sum(1 for s in failed if s.step.target == t) for t, label in enumerate(LABELS)},
        "first_error": None if not failed else f"{LABELS[failed[0].step.target]}: {failed[0].measurement.error}",
        "summary": summary,
        "differences": differences,
        "per_prompt": per_prompt,
        "measurements": [_measurement(s, prompts) for s in samples],
    }


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return cell(value, 1) if unit == "tok/s" else ms(value)


def _signed(value: float, unit: str) -> str:
    sign = "+" if value >= 0 else "-"
    return sign + _value(abs(value), unit)


def _factor(d: dict[str, Any]) -> str:
    """How many times faster, as printed: `1.90x` ("" when A's median is 0)."""
    ratio = d["ratio"]
    return f"{max(ratio, 1 / ratio):.2f}x" if ratio and ratio > 0 else ""


def _under(d: dict[str, Any]) -> str:
    """The thresholds a difference stays under: `under 5 ms`, `under 0.5 ms/token and 5%`."""
    missed = []
    if not d["absolute"]["passed"]:
        per = "/token" if d["absolute"]["per_token"] else ""
        missed.append(f"{d['absolute']['threshold_s'] * 1000:g} ms{per}")
    if not d["relative"]["passed"]:
        missed.append(f"{d['relative']['threshold'] * 100:g}%")
    return "under " + " and ".join(missed)


def _verdict(d: dict[str, Any] | None, unit: str) -> tuple[str, str]:
    """The difference column and the verdict column of the table."""
    if d is None:
        return "-", ""
    interval = f"{_signed(d['diff'], unit)} [{_signed(d['ci_low'], unit)}, {_signed(d['ci_high'], unit)}]"
    factor = _factor(d)
    if d["verdict"] == "too_few_pairs":
        return interval, "too few pairs to tell"
    if d["verdict"] == "not_significant":
        return interval, "no significant difference"
    if d["verdict"] == "below_threshold":
        faster = " ".join(w for w in (d["faster"], factor, "faster") if w)
        return interval, f"no difference that matters ({faster}, {_under(d)})"
    return interval, f"{d['faster']} faster" + (f", {factor}" if factor else "")


def _note(metric: Metric, d: dict[str, Any]) -> str:
    level = f"{d['level'] * 100:.0f}%"
    unit = metric.unit
    interval = f"{level} CI {_signed(d['ci_low'], unit)} to {_signed(d['ci_high'], unit)}"
    medians = f"A {_value(d['median_a'], unit)}, B {_value(d['median_b'], unit)}"
    pairs = f"{d['pairs']} pair{'' if d['pairs'] == 1 else 's'}"
    if d["verdict"] == "too_few_pairs":
        return (
            f"{metric.title}: too few pairs to tell ({medians}; {pairs}, at least {MIN_PAIRS} needed: "
            "more prompts or --runs)"
        )
    if d["verdict"] == "not_significant":
        return f"{metric.title}: no significant difference ({medians}; the {interval} spans 0)"
    difference = f"B - A = {_signed(d['diff'], unit)}"
    if d["verdict"] == "below_threshold":
        factor = _factor(d)
        return (
            f"{metric.title}: no difference that matters ({medians}; {difference}"
            f"{', ' + factor if factor else ''}: more than noise, {interval}, {pairs}, but {_under(d)})"
        )
    return f"{metric.title}: {d['faster']} is faster ({medians}; {difference}, {interval}, {pairs})"


def _thresholds(doc: dict[str, Any]) -> str:
    t = doc["thresholds"]
    return (
        f"a difference matters from {t['duration_s'] * 1000:g} ms ({t['per_token_s'] * 1000:g} ms/token for TPOT "
        f"and tok/s) and {t['relative'] * 100:g}% of the slower side "
        "(--min-diff-ms, --min-tpot-diff-ms, --min-diff-percent)"
    )


def text(doc: dict[str, Any]) -> str:
    """The side-by-side table, the per-prompt medians and one sentence per main metric."""
    lines = [
        f"compare {len(doc['prompts'])} prompts x {doc['runs']} runs via {doc['api']}, "
        f"order {doc['order']} (paired by prompt and round)"
    ]
    for t in doc["targets"]:
        lines.append(f"  {t['label']}  {t['base_url']}  model {t['model']}")
    lines.append("")
    rows = [("", "A p50", "A p95", "B p50", "B p95", "B - A [95% CI]", "verdict")]
    # Neither side reasons: its first answer token is its first token, and not a row of its own.
    reasons = any(doc["summary"][label][key] for label in LABELS for key in REASONING_KEYS[1:])
    for metric in METRICS:
        a, b = doc["summary"]["A"][metric.key], doc["summary"]["B"][metric.key]
        if (a is None and b is None) or (metric.key == "answer_ttft_s" and not reasons):
            continue
        diff, verdict = _verdict(doc["differences"][metric.key], metric.unit)
        rows.append(
            (metric.title,
             _value(a and a["p50"], metric.unit), _value(a and a["p95"], metric.unit),
             _value(b and b["p50"], metric.unit), _value(b and b["p95"], metric.unit), diff, verdict)
        )  # fmt: skip
    if len(rows) > 1:
        lines += align(rows, left=1, rule=True)
        lines.append("")
        prompt_rows = [("prompt (median)", "TTFT A", "TTFT B", "TPOT A", "TPOT B")]
        for row in doc["per_prompt"]:
            prompt_rows.append(
                (row["prompt"], _value(row["A"]["ttft_s"], "s"), _value(row["B"]["ttft_s"], "s"),
                 _value(row["A"]["tpot_s"], "s"), _value(row["B"]["tpot_s"], "s"))
            )  # fmt: skip
        lines += align(prompt_rows, left=1, rule=True)
        lines.append("")
        for metric in METRICS:
            d = doc["differences"][metric.key]
            if d is not None and (metric.key in NOTED or (reasons and metric.key in REASONING_KEYS[:2])):
                lines.append(_note(metric, d))
        lines.append(_thresholds(doc))
    else:
        lines.append("no request succeeded")
    failed = doc["failed"]
    if failed["A"] or failed["B"]:
        lines.append(f"failed: A {failed['A']}, B {failed['B']} requests; first: {doc['first_error']}")
    if doc["interrupted"]:
        lines.append(f"interrupted: measured {doc['completed']} of {doc['planned']} requests")
    return "\n".join(line.rstrip() for line in lines) + "\n"
