"""The async driver of one model's scheduler: it sleeps each step's (scaled) duration on the event
loop's clock, then hands the produced tokens to the request handlers waiting on them.

`time_scale` multiplies every model time: 0.1 runs ten times faster with the same ratios
(tests), 1.0 is the documented speed. Steps are paced against absolute deadlines so small
timer lateness doesn't add up over a long decode.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from proxy.sim.catalogue import ModelSpec
from proxy.sim.kvcache import KVCache, KVStats
from proxy.sim.physics import Physics
from proxy.sim.scheduler import Scheduler, Sequence

__all__ = ["ADMITTED", "Engine", "Handle", "RequestStats"]

ADMITTED = 0  # the first item a handle receives: its prefill has started
RECENT = 256


@dataclass(frozen=True, slots=True)
class RequestStats:
    """What the engine saw of one finished request (wall seconds, already scaled)."""

    id: str
    model: str
    status: str  # done | aborted
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    kv_bytes_peak: int
    queue_s: float | None
    ttft_s: float | None  # submit -> first token, inside the engine
    prefill_s: float  # model time of the prefill, scaled
    decode_s: float  # first -> last token, wall


class Handle:
    """A request's view of the engine: await `next()` for ADMITTED, then 1, 2, ... max_new."""

    def __init__(self, engine: Engine, seq: Sequence) -> None:
        self._engine = engine
        self.seq = seq
        self._queue: asyncio.Queue[int] = asyncio.Queue()

    @property
    def cached_tokens(self) -> int:
        return self.seq.alloc.cached_tokens if self.seq.alloc is not None else 0

    def _push(self, item: int) -> None:
        self._queue.put_nowait(item)

    async def next(self) -> int:
        return await self._queue.get()

    def cancel(self) -> None:
        """The client went away (or the request failed): free its batch slot and blocks."""
        self._engine._abort(self)


class Engine:
    """One model: its scheduler, its KV cache, and the task that runs the steps."""

    def __init__(
        self,
        spec: ModelSpec,
        physics: Physics,
        *,
        time_scale: float = 1.0,
        block_size: int = 16,
        max_batch: int = 64,
    ) -> None:
        self.spec = spec
        self.time_scale = time_scale
        kv = KVCache(max(1, spec.kv_cache_bytes // (spec.kv_bytes_per_token * block_size)), block_size)
        self.scheduler = Scheduler(spec, kv, physics, max_batch)
        self._handles: dict[int, Handle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.recent: deque[RequestStats] = deque(maxlen=RECENT)

    def kv_stats(self) -> KVStats:
        return self.scheduler.kv.stats()

    def fits(self, prompt_tokens: int, max_new: int) -> bool:
        return self.scheduler.fits(prompt_tokens, max_new)

    def submit(self, request_id: str, prompt: Seq[int], max_new: int) -> Handle:
        loop = asyncio.get_running_loop()
        seq = Sequence(id=request_id, prompt=prompt, max_new=max(1, max_new), submitted_at=loop.time())
        self.scheduler.submit(seq)
        handle = Handle(self, seq)
        self._handles[id(seq)] = handle
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name=f"sim-engine-{self.spec.name}")
        self._wake.set()
        return handle

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _abort(self, handle: Handle) -> None:
        seq = handle.seq
        if seq.state in ("waiting", "running"):
            self.scheduler.abort(seq)
            self._finish(handle)

    def _finish(self, handle: Handle) -> None:
        self._handles.pop(id(handle.seq), None)
        seq = handle.seq
        peak = seq.alloc.peak_blocks if seq.alloc is not None else 0
        scale = self.time_scale
        self.recent.append(
            RequestStats(
                id=seq.id,
                model=self.spec.name,
                status="done" if seq.state == "done" else "aborted",
                input_tokens=len(seq.prompt),
                cached_tokens=handle.cached_tokens,
                output_tokens=seq.produced,
                kv_bytes_peak=peak * self.scheduler.kv.block_size * self.spec.kv_bytes_per_token,
                queue_s=None if seq.admitted_at is None else seq.admitted_at - seq.submitted_at,
                ttft_s=None if seq.first_token_at is None else seq.first_token_at - seq.submitted_at,
                prefill_s=seq.prefill_s * scale,
                decode_s=0.0 if seq.first_token_at is None else (seq.last_token_at or 0.0) - seq.first_token_at,
            )
        )

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            now = loop.time()
            step = self.scheduler.plan(now)
            if step is None:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                continue
            for seq in step.admitted:
                handle = self._handles.get(id(seq))
                if handle is not None:
                    handle._push(ADMITTED)
            duration = step.duration * self.time_scale
            # absorb up to one step of lateness, never bank more (a busy loop must not burst tokens)
            deadline = max(deadline, now - duration) + duration
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
            for seq in self.scheduler.commit(step, loop.time()):
                handle = self._handles.get(id(seq))
                if handle is None:
                    continue
                handle._push(seq.produced)
                if seq.state == "done":
                    self._finish(handle)
