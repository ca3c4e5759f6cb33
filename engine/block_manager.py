"""Paged KV cache bookkeeping: a free list of fixed-size blocks and each sequence's block table."""
from __future__ import annotations

from collections import deque

from engine.sequence import Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        return max(0, blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Extend seq's table so it can hold `num_tokens` tokens."""
        need = self.blocks_needed(seq, num_tokens)
        if need > self.num_free:
            raise RuntimeError(f"KV cache exhausted: {need} blocks needed, {self.num_free} free")
        seq.block_table.extend(self.free_blocks.popleft() for _ in range(need))

    def free(self, seq: Sequence) -> None:
        self.free_blocks.extend(seq.block_table)
        seq.block_table = []
