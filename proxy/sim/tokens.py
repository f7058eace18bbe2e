"""Token counts for prompts: a real tokenizer when one is installed and usable offline, else an estimate.

The estimate (`EstimateTokenizer`) splits text the way byte-level BPE pre-tokenizers do and
charges each piece:
- a run of Latin letters with its leading space: one token per 6 letters (" the" = 1,
  " tokenizer" = 2), which lands near the usual 1.3 tokens per English word, ~4 chars per token;
- a run of digits: one token per 3 digits;
- a run of punctuation: one token per 2 characters;
- a run of whitespace: one token per 8 characters;
- any other letter (CJK, kana, Hangul...): one token per character;
- a chat-template marker such as `<|im_start|>`: one token.
Token ids are a CRC-32 of the piece, so equal text gives equal ids (what the prefix cache keys on).
"""

from __future__ import annotations

import re
import zlib
from typing import Protocol

__all__ = ["EstimateTokenizer", "Tokenizer", "load_tokenizer"]

# One alternation per rule above; a leading space joins the piece after it, as in BPE vocabularies.
_PIECE = re.compile(
    r"<\|[a-z_]+\|>"  # chat-template marker
    r"| ?[A-Za-z]{1,6}"  # Latin letters, 6 a token
    r"| ?[0-9]{1,3}"  # digits, 3 a token
    r"| ?[^\sA-Za-z0-9\w]{1,2}"  # punctuation, 2 a token
    r"| ?[^\W\d_]"  # any other letter: one each
    r"|\s{1,8}"  # whitespace, 8 a token
    r"|.",
    re.S,
)


class Tokenizer(Protocol):
    """Text in, token ids out."""

    name: str

    def encode(self, text: str) -> list[int]: ...


class EstimateTokenizer:
    """The documented estimate: no vocabulary, no download, deterministic."""

    name = "estimate"

    def pieces(self, text: str) -> list[str]:
        return _PIECE.findall(text)

    def encode(self, text: str) -> list[int]:
        crc = zlib.crc32
        return [crc(piece.encode("utf-8")) for piece in _PIECE.findall(text)]


class _Tiktoken:
    def __init__(self, encoding: object) -> None:
        self._encoding = encoding
        self.name = f"tiktoken:{getattr(encoding, 'name', '?')}"

    def encode(self, text: str) -> list[int]:
        return list(self._encoding.encode(text, disallowed_special=()))  # type: ignore[attr-defined]


def load_tokenizer(kind: str = "auto", encoding: str = "o200k_base") -> Tokenizer:
    """`estimate`, `tiktoken` (fails loudly when unusable) or `auto` (tiktoken if it loads, else estimate)."""
    if kind == "estimate":
        return EstimateTokenizer()
    try:
        import tiktoken  # type: ignore[import-not-found, unused-ignore]  # optional: typed when installed (the [test] extra brings it), absent otherwise

        return _Tiktoken(tiktoken.get_encoding(encoding))
    except Exception:  # not installed, or its vocabulary can't be fetched offline
        if kind == "tiktoken":
            raise
        return EstimateTokenizer()
