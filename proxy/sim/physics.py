"""The timing model, as pure functions of a model's constants (seconds at time_scale 1).

prefill(new, cached) = base + per_token * new                      (the matmuls: linear)
                     + attention * new * (cached + new)            (each new token attends to all)
                     + per_token * cache_residual * cached          (a cache hit is not quite free)
decode_step(n)       = decode_per_token * (1 + batch_slowdown * (n - 1))

Decode does not depend on the input length: each step produces one token for every running
sequence, so its time is set by the model's size (weights read per step) and, gently, by the
batch size (continuous batching).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.sim.catalogue import ModelSpec

__all__ = ["Physics"]


@dataclass(frozen=True, slots=True)
class Physics:
    """Model-independent knobs of the timing model."""

    batch_slowdown: float = 0.04  # +4% per extra stream in the same decode step
    cache_residual: float = 0.05  # share of a cached token's prefill cost still paid

    def prefill_seconds(self, spec: ModelSpec, new_tokens: int, cached_tokens: int = 0) -> float:
        new = max(0, new_tokens)
        cached = max(0, cached_tokens)
        return (
            spec.prefill_base_s
            + spec.prefill_per_token_s * new
            + spec.prefill_attention_s * new * (cached + new)
            + spec.prefill_per_token_s * self.cache_residual * cached
        )

    def decode_step_seconds(self, spec: ModelSpec, running: int) -> float:
        if running <= 0:
            return 0.0
        return spec.decode_per_token_s * (1.0 + self.batch_slowdown * (running - 1))
