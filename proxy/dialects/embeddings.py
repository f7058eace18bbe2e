"""OpenAI embeddings: one JSON body, never a stream; only usage (input tokens) and the model
that answered are read, from the ends of a large body."""

from __future__ import annotations

import re
from typing import Any

from proxy.dialects.dialect import Dialect
from proxy.dialects.reader import StreamReader, loads, model_name, openai_usage

__all__ = ["API_EMBEDDINGS", "DIALECT", "EMBEDDINGS_FULL_PARSE", "EmbeddingsReader"]

API_EMBEDDINGS = "embeddings"
EMBEDDINGS_FULL_PARSE = 64 << 10  # larger embeddings bodies: only their ends are read
_EDGE = 8 << 10
_MODEL_FIELD = re.compile(rb'"model"\s*:\s*"([^"\\]{1,256})"')


def _flat_object_after(buf: bytes, key: bytes) -> dict[str, Any] | None:
    """The flat JSON object that follows the last `key` in `buf` (e.g. `"usage": {...}`)."""
    i = buf.rfind(key)
    start = buf.find(b"{", i + len(key)) if i >= 0 else -1
    end = buf.find(b"}", start) if start >= 0 else -1
    obj = loads(bytes(buf[start : end + 1])) if end > start else None
    return obj if isinstance(obj, dict) else None


class EmbeddingsReader(StreamReader):
    """OpenAI `/embeddings`: one JSON body (never a stream); only usage and identity are read."""

    __slots__ = ()

    def _read(self, kind: str, obj: dict[str, Any]) -> bool:
        return False  # an SSE body here is not the embeddings API: read nothing, count no token

    def read_body(self, body: bytes) -> None:
        if len(body) > EMBEDDINGS_FULL_PARSE:
            self._read_ends(body)
        else:
            super().read_body(body)

    def _read_whole(self, obj: dict[str, Any]) -> None:
        self._meta(obj)  # `id` is absent here; `model` is the one that answered
        self.usage = openai_usage(obj.get("usage"))

    def _read_ends(self, body: bytes) -> None:
        """Usage and model of a large body from its last and first 8 KiB (both orders seen: OpenAI
        writes them after `data`, some servers before it). Parsing megabytes of vectors would hold
        the event loop for milliseconds; anything not found is left unknown."""
        for edge in (body[-_EDGE:], body[:_EDGE]):
            if self.usage is None:
                self.usage = openai_usage(_flat_object_after(edge, b'"usage"'))
            if self.response_model is None:
                found = _MODEL_FIELD.search(edge)
                self.response_model = model_name(found.group(1).decode("utf-8", "replace")) if found else None


DIALECT = Dialect(
    api=API_EMBEDDINGS,
    path_suffix="/embeddings",
    operation="embeddings",
    provider="openai",
    reader=EmbeddingsReader,
)
