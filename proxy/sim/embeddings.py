"""`POST …/embeddings`: OpenAI's embeddings API, answered with deterministic unit vectors.

Each input (a string, a list of strings, a token array or a list of token arrays) gets a vector
drawn from a hash of its content, normalised to length 1, of the model's size or `dimensions`;
`encoding_format: base64` packs the float32s as OpenAI does. Usage counts prompt tokens only.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from dataclasses import dataclass
from typing import Any

from proxy.sim.errors import bad_request, model_not_found
from proxy.sim.tokens import Tokenizer

__all__ = ["EMBEDDING_MODELS", "EmbeddingRequest", "embeddings_body", "parse_embeddings"]

EMBEDDING_MODELS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}
MAX_INPUTS = 2048


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """The inputs to embed, as token counts and a content key each, and the output shape."""

    model: str
    inputs: tuple[tuple[int, bytes], ...]  # (tokens, bytes the vector is drawn from)
    dimensions: int
    base64: bool

    @property
    def tokens(self) -> int:
        return sum(n for n, _ in self.inputs)


def _one(item: object, tokenizer: Tokenizer) -> tuple[int, bytes] | None:
    if isinstance(item, str):
        return len(tokenizer.encode(item)), item.encode()
    if isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
        return len(item), repr(item).encode()
    return None


def parse_embeddings(body: object, tokenizer: Tokenizer) -> EmbeddingRequest:
    """Validate a request body as OpenAI does; `SimError` 404 for a model that does not embed, 400 otherwise."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise bad_request("you must provide a model parameter")
    if body["model"] not in EMBEDDING_MODELS:
        raise model_not_found(body["model"])
    raw = body.get("input")
    items = raw if isinstance(raw, list) and raw and not all(isinstance(t, int) for t in raw) else [raw]
    if not items or len(items) > MAX_INPUTS:
        raise bad_request(f"'input' must hold 1 to {MAX_INPUTS} items")
    inputs = [_one(item, tokenizer) for item in items]
    if any(i is None or i[0] == 0 for i in inputs):
        raise bad_request("'input' must be a non-empty string, an array of strings or an array of token arrays")
    size = EMBEDDING_MODELS[body["model"]]
    dimensions = body.get("dimensions", size)
    if not isinstance(dimensions, int) or isinstance(dimensions, bool) or not 1 <= dimensions <= size:
        raise bad_request(f"'dimensions' must be an integer from 1 to {size} for {body['model']}")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad_request("'encoding_format' must be 'float' or 'base64'")
    return EmbeddingRequest(body["model"], tuple(i for i in inputs if i is not None), dimensions, fmt == "base64")


def _vector(seed: bytes, n: int) -> list[float]:
    values: list[float] = []
    counter = 0
    while len(values) < n:
        block = hashlib.sha256(seed + counter.to_bytes(4, "big")).digest()
        values.extend((b - 127.5) / 127.5 for b in block)
        counter += 1
    del values[n:]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [round(v / norm, 6) for v in values]


def embeddings_body(req: EmbeddingRequest) -> dict[str, Any]:
    """The response body: one embedding per input, in order, and the prompt-token usage."""
    data: list[dict[str, Any]] = []
    for index, (_, seed) in enumerate(req.inputs):
        vector = _vector(seed, req.dimensions)
        embedding: Any = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if req.base64 else vector
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return {
        "object": "list",
        "data": data,
        "model": req.model,
        "usage": {"prompt_tokens": req.tokens, "total_tokens": req.tokens},
    }
