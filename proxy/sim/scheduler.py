"""Continuous batching, as a pure state machine (the engine's clock and sleeps live elsewhere).

Each step: admit waiting sequences in arrival order while the batch has room and the KV cache
can hold them (prefill, which yields each one's first token), and decode one token for every
sequence already running. The step lasts the sum of the admitted prefills plus one decode step
for the running batch, so a long prefill delays everyone's next token, as on a real server.

    sched.submit(seq); step = sched.plan(now); ...sleep step.duration...; sched.commit(step, now)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from proxy.sim.catalogue import ModelSpec
from proxy.sim.kvcache import Allocation, KVCache
from proxy.sim.physics import Physics

__all__ = ["Scheduler", "Sequence", "Step"]


@dataclass(eq=False, slots=True)
class Sequence:
    """One request inside the engine; the scheduler moves it waiting -> running -> done."""

    id: str
    prompt: Seq[int]
    max_new: int  # tokens it will produce (reasoning + answer)
    submitted_at: float
    state: str = "waiting"  # waiting | running | done | aborted
    produced: int = 0
    alloc: Allocation | None = None
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    prefill_s: float = 0.0  # model time of its prefill (unscaled)
    decode_s: float = 0.0  # model time of its decode steps (unscaled)


@dataclass(frozen=True, slots=True)
class Step:
    """What one engine iteration does, and how long it takes (unscaled seconds)."""

    admitted: tuple[Sequence, ...]
    decoding: tuple[Sequence, ...]
    prefill_s: float
    decode_s: float

    @property
    def duration(self) -> float:
        return self.prefill_s + self.decode_s


class Scheduler:
    """One model's batch: a waiting queue, a running set, its KV cache."""

    def __init__(self, spec: ModelSpec, kv: KVCache, physics: Physics, max_batch: int = 64) -> None:
        self.spec = spec
        self.kv = kv
        self.physics = physics
        self.max_batch = max_batch
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def fits(self, prompt_tokens: int, max_new: int) -> bool:
        """Could this request ever be admitted (alone, on an empty cache)?"""
        return self.kv.fits_ever(prompt_tokens + max_new)

    def submit(self, seq: Sequence) -> None:
        if not self.fits(len(seq.prompt), seq.max_new):
            raise ValueError("sequence can never fit in the KV cache")
        self._waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        if seq.state == "waiting":
            self._waiting.remove(seq)
        elif seq.state == "running":
            self._running.remove(seq)
            if seq.alloc is not None:
                self.kv.release(seq.alloc)
        if seq.state in ("waiting", "running"):
            seq.state = "aborted"

    def plan(self, now: float) -> Step | None:
        """Admit what fits and return the next step, or None when there is nothing to do."""
        admitted: list[Sequence] = []
        prefill = 0.0
        while self._waiting and len(self._running) + len(admitted) < self.max_batch:
            seq = self._waiting[0]
            alloc = self.kv.allocate(seq.prompt, seq.max_new)
            if alloc is None:
                break  # head-of-line: wait for running sequences to release blocks
            self._waiting.popleft()
            seq.alloc = alloc
            seq.state = "running"
            seq.admitted_at = now
            seq.prefill_s = self.physics.prefill_seconds(
                self.spec, len(seq.prompt) - alloc.cached_tokens, alloc.cached_tokens
            )
            prefill += seq.prefill_s
            admitted.append(seq)
        decoding = tuple(self._running)
        self._running.extend(admitted)
        if not admitted and not decoding:
            return None
        decode = self.physics.decode_step_seconds(self.spec, len(decoding))
        return Step(tuple(admitted), decoding, prefill, decode)

    def commit(self, step: Step, now: float) -> list[Sequence]:
        """The step's time has passed: each live sequence in it produced one token."""
        produced: list[Sequence] = []
        for seq in (*step.admitted, *step.decoding):
            if seq.state != "running":
                continue  # aborted while the step ran
            seq.produced += 1
            if seq.produced == 1:
                seq.first_token_at = now
            else:
                seq.decode_s += step.decode_s
            seq.last_token_at = now
            assert seq.alloc is not None
            self.kv.append(seq.alloc)
            if seq.produced >= seq.max_new:
                seq.state = "done"
                self._running.remove(seq)
                self.kv.release(seq.alloc)
            produced.append(seq)
        return produced
