"""The contiguous KV cache: one row of `max_model_len` token slots per running sequence.

This is what Hugging Face `generate` and every static-batching server do: a sequence
reserves room for the longest answer it could ever produce the moment it starts. It is
simple and correct, and it wastes most of the memory it reserves (notebook 04 measures
how much); the paged cache fixes that. In the engine's terms a row is one block of
`max_model_len` tokens, so the same attention code serves both caches.
"""
from __future__ import annotations


class ContiguousCacheManager:
    def __init__(self, num_rows: int):
        self.num_total_blocks = num_rows
        self.free_rows = list(range(num_rows - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_rows)

    def can_allocate(self, seq) -> bool:
        return bool(self.free_rows)

    def allocate(self, seq) -> None:
        seq.block_table = [self.free_rows.pop()]

    def free(self, seq) -> None:
        self.free_rows.extend(seq.block_table)
        seq.block_table = []
