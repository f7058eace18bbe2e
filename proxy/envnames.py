"""`TAOTRACE_*` variables that no command reads, and the known name each was probably meant to be (pure).

pydantic-settings ignores a variable it does not know, so `TAOTRACE_UPSTREM=http://vllm:8000`
would start the proxy against the default upstream with the user's key. The command line warns
for each such name, with the closest known one; never with the value (it may be a key).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable
from dataclasses import dataclass

__all__ = ["PREFIX", "Unknown", "unknown_variables"]

PREFIX = "TAOTRACE_"
# Compared without the prefix every name shares, so that a name close to none gets no guess.
CLOSENESS = 0.6


@dataclass(frozen=True)
class Unknown:
    """A `TAOTRACE_*` variable no command reads; `closest`: the known name it resembles, if any."""

    name: str
    closest: str | None

    def warning(self) -> str:
        guess = f"; did you mean {self.closest}?" if self.closest else ""
        return f"{self.name} is not a taotrace setting and is ignored{guess}"


def unknown_variables(names: Iterable[str], known: Collection[str]) -> list[Unknown]:
    """The `TAOTRACE_*` names among `names` not in `known` (both compared upper-case, as
    pydantic-settings reads them), sorted, each with its closest known name."""
    known_upper = {k.upper() for k in known}
    stems = {k[len(PREFIX) :]: k for k in known_upper if k.startswith(PREFIX)}
    out = []
    for name in sorted(names):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in known_upper:
            continue
        close = difflib.get_close_matches(upper[len(PREFIX) :], list(stems), n=1, cutoff=CLOSENESS)
        out.append(Unknown(name, stems[close[0]] if close else None))
    return out
