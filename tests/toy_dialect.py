"""A dialect taotrace does not ship, whole in this one module: what adding an API takes.

The toy API serves `POST …/toy/generate`. Streamed, it sends `event: piece` (`{"piece": "…"}`,
a token when not empty), `event: heartbeat` (nothing) and a final `event: finish`
(`{"reason": …, "usage": {"in": N, "out": M}}`); whole, one JSON object
`{"id", "model", "text", "reason", "usage"}`.
"""

from __future__ import annotations

from typing import Any

from proxy.dialects import Dialect, StreamReader, Usage, nonneg_int

__all__ = ["TOY", "ToyReader"]


def _usage(u: object) -> Usage | None:
    if not isinstance(u, dict):
        return None
    return Usage(input_tokens=nonneg_int(u.get("in")), output_tokens=nonneg_int(u.get("out")))


class ToyReader(StreamReader):
    """Pieces are tokens; `finish` ends the answer and says the usage."""

    __slots__ = ()
    SKIP = frozenset({"heartbeat"})

    def _read(self, kind: str, obj: dict[str, Any]) -> bool:
        if kind == "piece":
            piece = obj.get("piece")
            self._keep(piece)
            return isinstance(piece, str) and piece != ""
        if kind == "finish":
            self.done = True
            self.usage = _usage(obj.get("usage"))
            self._finish(obj.get("reason"))
        return False

    def _read_whole(self, obj: dict[str, Any]) -> None:
        self._meta(obj)
        self.usage = _usage(obj.get("usage"))
        self._finish(obj.get("reason"))
        self._keep(obj.get("text"))


TOY = Dialect(
    api="toy",
    path_suffix="/toy/generate",
    operation="generate_content",
    provider="toy",
    reader=ToyReader,
    params=(("temperature", "gen_ai.request.temperature", float), ("length", "gen_ai.request.max_tokens", int)),
)
