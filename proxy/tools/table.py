"""Plain-text tables for the commands' output (probe, demo): numbers to cells, cells to columns."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["align", "cell"]


def cell(value: float | None, digits: int = 0, scale: float = 1.0, unit: str = "") -> str:
    """A number as a table cell (`-` when absent): `cell(0.0123, 1, 1000, " ms")` -> `12.3 ms`."""
    return "-" if value is None else f"{value * scale:.{digits}f}{unit}"


def align(rows: Sequence[Sequence[str]], left: int = 1, rule: bool = False) -> list[str]:
    """Pad each column to its widest cell: the first `left` columns to the left, the rest to the
    right; `rule` puts a line of dashes under the header row."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
