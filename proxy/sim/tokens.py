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

_PIECE = re.compile(r"<\|[a-z_]+\|>| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9\w]+| ?[^\W\d_]+|\s+|.", re.S)
_WORD = 6
_DIGITS = 3
_PUNCT = 2
_SPACE = 8


class Tokenizer(Protocol):
    """Text in, token ids out."""

    name: str

    def encode(self, text: str) -> list[int]: ...


def _chunks(piece: str, size: int) -> list[str]:
    head = 1 if piece[:1] == " " and len(piece) > 1 else 0
    body = piece[head:]
    parts = [body[i : i + size] for i in range(0, len(body), size)] or [piece]
    if head:
        parts[0] = " " + parts[0]
    return parts


def _split(piece: str) -> list[str]:
    if piece.startswith("<|"):
        return [piece]
    core = piece.lstrip(" ")
    if not core:
        return _chunks(piece, _SPACE)
    first = core[0]
    if first.isspace():
        return _chunks(piece, _SPACE)
    if first.isascii() and first.isalpha():
        return _chunks(piece, _WORD)
    if first.isdigit():
        return _chunks(piece, _DIGITS)
    if first.isalpha() or first.isdigit():  # non-Latin letters: one token each
        return _chunks(piece, 1)
    return _chunks(piece, _PUNCT)


class EstimateTokenizer:
    """The documented estimate: no vocabulary, no download, deterministic."""

    name = "estimate"

    def pieces(self, text: str) -> list[str]:
        out: list[str] = []
        for match in _PIECE.finditer(text):
            out.extend(_split(match.group(0)))
        return out

    def encode(self, text: str) -> list[int]:
        return [zlib.crc32(piece.encode("utf-8")) for piece in self.pieces(text)]


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
        import tiktoken  # type: ignore[import-not-found]

        return _Tiktoken(tiktoken.get_encoding(encoding))
    except Exception:  # not installed, or its vocabulary can't be fetched offline
        if kind == "tiktoken":
            raise
        return EstimateTokenizer()
