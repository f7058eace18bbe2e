"""The simulated models: their shape (for KV-cache bytes) and their timing constants.

Shapes follow open models of a similar class so that bytes per token are plausible:
`gpt-4o-mini` is shaped like an 8B model, `gpt-4o` like a 70B one, `o3-mini` in between; `o4-mini`
is `o3-mini` with its reasoning hidden (counted in the usage, never streamed).
All times are seconds at `time_scale = 1`. A JSON file can replace or add models
(`taotrace sim --catalogue FILE`: `{"models": [{"name": ..., <any field below>}]}`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_CATALOGUE", "ModelSpec", "catalogue_from"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One simulated model: shape, KV-cache size and the constants of its timing model."""

    name: str
    # shape -> KV bytes per token = 2 (K and V) * layers * kv_heads * head_dim * dtype_bytes
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    kv_cache_bytes: int  # the fixed KV pool of this model's "GPU"
    context_window: int
    # prefill: base + per_token * new + attention * new * (cached + new) + per_token * cache_residual * cached
    prefill_base_s: float
    prefill_per_token_s: float
    prefill_attention_s: float
    # decode: one step per output token for the whole batch; grows by batch_slowdown per extra stream
    decode_per_token_s: float
    # output length: without a limit in the request, the answer's natural length (after any
    # reasoning); with one, exactly that many tokens, but never more than max_output_tokens
    natural_output_tokens: int = 96
    max_output_tokens: int = 4096
    reasoning_tokens: int = 0  # > 0: a reasoning model; streamed before the answer (medium effort)
    # True: its reasoning is generated, counted (`reasoning_tokens` in the usage) and billed, but
    # never streamed, as OpenAI's o-series through chat completions: the first token is the answer's
    reasoning_hidden: bool = False
    owned_by: str = "taotrace-sim"

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def reasoning(self) -> bool:
        return self.reasoning_tokens > 0


_GIB = 1 << 30

DEFAULT_CATALOGUE: tuple[ModelSpec, ...] = (
    # fast: Llama-3-8B-like shape, 128 KiB per token, 2 GiB pool (16k tokens)
    ModelSpec(
        name="gpt-4o-mini",
        layers=32,
        kv_heads=8,
        head_dim=128,
        dtype_bytes=2,
        kv_cache_bytes=2 * _GIB,
        context_window=16_384,
        prefill_base_s=0.030,
        prefill_per_token_s=0.000_05,
        prefill_attention_s=2e-9,
        decode_per_token_s=0.012,
    ),
    # strong: Llama-3-70B-like shape, 320 KiB per token, 5 GiB pool (16k tokens)
    ModelSpec(
        name="gpt-4o",
        layers=80,
        kv_heads=8,
        head_dim=128,
        dtype_bytes=2,
        kv_cache_bytes=5 * _GIB,
        context_window=16_384,
        prefill_base_s=0.050,
        prefill_per_token_s=0.000_15,
        prefill_attention_s=6e-9,
        decode_per_token_s=0.030,
    ),
    # reasoning: a 32B-like shape (64 layers), 256 KiB per token, 4 GiB pool; thinks before answering
    ModelSpec(
        name="o3-mini",
        layers=64,
        kv_heads=8,
        head_dim=128,
        dtype_bytes=2,
        kv_cache_bytes=4 * _GIB,
        context_window=16_384,
        prefill_base_s=0.040,
        prefill_per_token_s=0.000_08,
        prefill_attention_s=3e-9,
        decode_per_token_s=0.015,
        natural_output_tokens=64,
        reasoning_tokens=64,
    ),
    # reasoning, hidden: o3-mini's shape and pace, but its reasoning is never streamed: nothing
    # arrives until the answer, and only the usage's `reasoning_tokens` says it thought
    ModelSpec(
        name="o4-mini",
        layers=64,
        kv_heads=8,
        head_dim=128,
        dtype_bytes=2,
        kv_cache_bytes=4 * _GIB,
        context_window=16_384,
        prefill_base_s=0.040,
        prefill_per_token_s=0.000_08,
        prefill_attention_s=3e-9,
        decode_per_token_s=0.015,
        natural_output_tokens=64,
        reasoning_tokens=64,
        reasoning_hidden=True,
    ),
)


def catalogue_from(data: Mapping[str, Any], base: Iterable[ModelSpec] = DEFAULT_CATALOGUE) -> tuple[ModelSpec, ...]:
    """Apply a `{"models": [...]}` document: entries naming a known model override its fields."""
    known = {spec.name: spec for spec in base}
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    for entry in data.get("models", []):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise ValueError("each catalogue entry needs a 'name'")
        unknown = set(entry) - fields
        if unknown:
            raise ValueError(f"unknown catalogue fields: {', '.join(sorted(unknown))}")
        name = entry["name"]
        if name in known:
            known[name] = dataclasses.replace(known[name], **entry)
        else:
            known[name] = ModelSpec(**entry)
    return tuple(known.values())
