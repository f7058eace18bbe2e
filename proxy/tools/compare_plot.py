"""`taotrace compare --plot FILE.svg`: a per-prompt dot plot of TTFT and TPOT per target. Pure.

Hand-written SVG (no plotting library): one panel per metric, one row per prompt, a dot per
request (A above the row's line, B below) and a bar at each target's median. Every text is
XML-escaped; the file opens in any browser.
"""

from __future__ import annotations

import math
from typing import Any
from xml.sax.saxutils import escape

__all__ = ["svg"]

_COLOURS = {"A": "#1f77b4", "B": "#ff7f0e"}
_PANELS = (("ttft_s", "TTFT (ms)"), ("tpot_s", "TPOT (ms)"))
_ROW = 30
_LABEL_W = 150
_PANEL_W = 340
_GAP = 30
_TOP = 70
_BOTTOM = 40


def _nice_step(span: float, ticks: int = 5) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about `ticks` ticks over `span`."""
    raw = span / ticks
    power: float = 10.0 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def _num(value: float) -> str:
    return f"{value:.1f}"


def _panel(doc: dict[str, Any], key: str, title: str, x0: float) -> list[str]:
    values_ms = [m[key] * 1000 for m in doc["measurements"] if m["error"] is None and m[key] is not None]
    top = max(values_ms, default=1.0) or 1.0
    step = _nice_step(top)
    limit = step * math.ceil(top / step)
    bottom = _TOP + len(doc["prompts"]) * _ROW

    def x(v: float) -> float:
        return x0 + v / limit * _PANEL_W

    out = [f'<text x="{_num(x0 + _PANEL_W / 2)}" y="{_TOP - 12}" text-anchor="middle" font-weight="bold">'
           f"{escape(title)}</text>"]  # fmt: skip
    out.append(
        f'<rect x="{_num(x0)}" y="{_TOP}" width="{_PANEL_W}" height="{bottom - _TOP}" fill="none" stroke="#999"/>'
    )
    tick = 0.0
    while tick <= limit + step / 2:
        tx = _num(x(tick))
        out.append(f'<line x1="{tx}" y1="{_TOP}" x2="{tx}" y2="{bottom}" stroke="#eee"/>')
        out.append(f'<text x="{tx}" y="{bottom + 16}" text-anchor="middle" font-size="11">{tick:g}</text>')
        tick += step
    names = {name: i for i, name in enumerate(doc["prompts"])}
    for m in doc["measurements"]:
        if m["error"] is not None or m[key] is None:
            continue
        offset = -6 if m["target"] == "A" else 6
        cy = _TOP + names[m["prompt"]] * _ROW + _ROW / 2 + offset
        out.append(
            f'<circle cx="{_num(x(m[key] * 1000))}" cy="{_num(cy)}" r="3" fill="{_COLOURS[m["target"]]}" '
            f'fill-opacity="0.6"><title>{escape(m["target"])} {escape(m["prompt"])} round {m["round"]}: '
            f"{m[key] * 1000:.1f} ms</title></circle>"
        )
    for i, row in enumerate(doc["per_prompt"]):
        for label in ("A", "B"):
            med = row[label][key]
            if med is None:
                continue
            cy = _TOP + i * _ROW + _ROW / 2 + (-6 if label == "A" else 6)
            mx = _num(x(med * 1000))
            out.append(
                f'<line x1="{mx}" y1="{_num(cy - 5)}" x2="{mx}" y2="{_num(cy + 5)}" stroke="{_COLOURS[label]}" '
                f'stroke-width="2.5"><title>{label} median {med * 1000:.1f} ms</title></line>'
            )
    return out


def svg(doc: dict[str, Any]) -> str:
    """The plot of a `compare_report.result` document, as an SVG text."""
    rows = len(doc["prompts"])
    width = _LABEL_W + 2 * _PANEL_W + _GAP + 20
    height = _TOP + rows * _ROW + _BOTTOM + 20
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    legend_x = 10
    for t in doc["targets"]:
        label = t["label"]
        caption = f"{label}: {t['base_url']} ({t['model']})"
        out.append(f'<circle cx="{legend_x + 5}" cy="16" r="5" fill="{_COLOURS[label]}"/>')
        out.append(f'<text x="{legend_x + 14}" y="20">{escape(caption)}</text>')
        legend_x += 20 + 7 * len(caption)
    for i, name in enumerate(doc["prompts"]):
        y = _TOP + i * _ROW + _ROW / 2 + 4
        out.append(f'<text x="{_LABEL_W - 8}" y="{_num(y)}" text-anchor="end">{escape(name)}</text>')
    for n, (key, title) in enumerate(_PANELS):
        x0 = _LABEL_W + n * (_PANEL_W + _GAP)
        out += _panel(doc, key, title, x0)
    note = f"dots: one request each (A above, B below); bars: medians; {doc['completed']} requests"
    out.append(f'<text x="10" y="{height - 8}" font-size="11" fill="#555">{escape(note)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
