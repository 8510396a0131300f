"""Sliding-window attention's KV side (Mistral): each query sees only the last `window` keys.

So the blocks behind a sequence's window are given back as it advances, and a request never holds more than
its window plus one step's tokens. The attention backends apply the window's mask; the KV side is all here.
"""
from __future__ import annotations

from .block_manager import BlockManager, cdiv


class SlidingWindow:
    def __init__(self, window: int, block_size: int):
        self.window, self.block_size = window, block_size

    def release_behind(self, blocks: BlockManager, seq) -> None:
        """Give back the blocks that the sequence's next query (at num_computed_tokens) can no longer see."""
        blocks.release_outside_window(seq, seq.num_computed_tokens - self.window + 1)

    def max_blocks(self, num_tokens: int, max_num_batched_tokens: int) -> int:
        """The most blocks a sequence of `num_tokens` holds at once."""
        return min(cdiv(num_tokens, self.block_size),
                   cdiv(self.window + max_num_batched_tokens, self.block_size) + 1)
