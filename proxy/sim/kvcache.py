"""A paged KV cache with a prefix cache, as vLLM keeps one: fixed-size blocks of tokens.

A sequence holds the blocks of its prompt plus those it grows while decoding, and reserves at
admission the blocks its whole output will need (so nothing is ever preempted). Full prompt
blocks are keyed by a hash chained over the blocks before them; when a sequence ends, those
blocks stay resident with no owner and a later prompt with the same prefix takes them back
instead of recomputing them. Ownerless cached blocks are evicted least recently used first,
only when free blocks run out. Pure bookkeeping: no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Allocation", "KVCache", "KVStats"]


@dataclass(frozen=True, slots=True)
class KVStats:
    """A snapshot of the pool, in blocks."""

    block_size: int
    total_blocks: int
    used_blocks: int  # held by running sequences
    cached_blocks: int  # resident, ownerless, reusable by a matching prefix
    free_blocks: int
    reserved_blocks: int  # promised to running sequences for the tokens they have yet to write


@dataclass(slots=True)
class Allocation:
    """The blocks one sequence holds; `cached_tokens` of its prompt came from the prefix cache."""

    blocks: list[int]
    cached_tokens: int
    tokens: int  # tokens written so far (prompt, then one per decoded token)
    reserved: int  # blocks still promised to it
    peak_blocks: int = 0
    released: bool = field(default=False)


class KVCache:
    """The pool of one model. `allocate` -> `append` per token -> `release`."""

    def __init__(self, total_blocks: int, block_size: int = 16) -> None:
        if total_blocks <= 0 or block_size <= 0:
            raise ValueError("total_blocks and block_size must be positive")
        self.block_size = block_size
        self.total_blocks = total_blocks
        self._refs = [0] * total_blocks
        self._hash_of: list[int | None] = [None] * total_blocks
        self._by_hash: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # LRU order: oldest first
        self._free: list[int] = list(range(total_blocks - 1, -1, -1))
        self._reserved = 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _hashes(self, prompt: Sequence[int]) -> list[int]:
        out: list[int] = []
        prev = 0
        for start in range(0, len(prompt) - self.block_size + 1, self.block_size):
            prev = hash((prev, tuple(prompt[start : start + self.block_size])))
            out.append(prev)
        return out

    def _matched(self, hashes: list[int], prompt_len: int) -> list[int]:
        blocks: list[int] = []
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            blocks.append(block)
        # at least one prompt token is always computed (its logits give the first output token)
        if blocks and len(blocks) * self.block_size >= prompt_len:
            blocks.pop()
        return blocks

    def available(self) -> int:
        """Blocks a new sequence could take: free, plus evictable, minus promises."""
        return len(self._free) + len(self._evictable) - self._reserved

    def fits_ever(self, total_tokens: int) -> bool:
        return self.blocks_for(total_tokens) <= self.total_blocks

    def allocate(self, prompt: Sequence[int], max_new_tokens: int) -> Allocation | None:
        """Admit a sequence, or None when the pool can't hold its prompt and output now."""
        hashes = self._hashes(prompt)
        matched = self._matched(hashes, len(prompt))
        prompt_blocks = self.blocks_for(len(prompt))
        need_total = self.blocks_for(len(prompt) + max_new_tokens)
        reusable_evictable = sum(1 for b in matched if b in self._evictable)
        if need_total - len(matched) > self.available() - reusable_evictable:
            return None
        blocks: list[int] = []
        for block in matched:
            self._ref(block)
            blocks.append(block)
        for index in range(len(matched), prompt_blocks):
            block = self._take()
            if index < len(hashes) and hashes[index] not in self._by_hash:
                self._register(block, hashes[index])
            blocks.append(block)
        reserve = need_total - prompt_blocks
        self._reserved += reserve
        return Allocation(
            blocks=blocks,
            cached_tokens=len(matched) * self.block_size,
            tokens=len(prompt),
            reserved=reserve,
            peak_blocks=len(blocks),
        )

    def append(self, alloc: Allocation, count: int = 1) -> None:
        """The sequence wrote `count` more tokens; a new block is taken when one fills up."""
        alloc.tokens += count
        while self.blocks_for(alloc.tokens) > len(alloc.blocks):
            if alloc.reserved > 0:
                alloc.reserved -= 1
                self._reserved -= 1
            alloc.blocks.append(self._take())
        alloc.peak_blocks = max(alloc.peak_blocks, len(alloc.blocks))

    def release(self, alloc: Allocation) -> None:
        """The sequence ended (or was aborted): drop its blocks; hashed ones stay cached."""
        if alloc.released:
            return
        alloc.released = True
        self._reserved -= alloc.reserved
        alloc.reserved = 0
        for block in alloc.blocks:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if self._hash_of[block] is not None:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
        alloc.blocks = []

    def stats(self) -> KVStats:
        used = sum(1 for r in self._refs if r > 0)
        return KVStats(
            block_size=self.block_size,
            total_blocks=self.total_blocks,
            used_blocks=used,
            cached_blocks=len(self._evictable),
            free_blocks=len(self._free),
            reserved_blocks=self._reserved,
        )

    def _ref(self, block: int) -> None:
        if self._refs[block] == 0:
            self._evictable.pop(block, None)
        self._refs[block] += 1

    def _register(self, block: int, h: int) -> None:
        self._hash_of[block] = h
        self._by_hash[h] = block

    def _take(self) -> int:
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._evictable.popitem(last=False)
            old = self._hash_of[block]
            if old is not None and self._by_hash.get(old) == block:
                del self._by_hash[old]
            self._hash_of[block] = None
        self._refs[block] = 1
        return block
