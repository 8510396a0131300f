"""The block tables of the running sequences, in one persistent host tensor.

The attention kernels read a step's block tables as one `[num_seqs, width]` tensor. Rebuilding it
from every sequence's Python list at every step costs O(blocks) Python work per sequence per step;
yet between two steps a decoding sequence gains a block only once every `block_size` tokens. So each
running sequence keeps a row here, and a step writes only the blocks added since the last one
(vLLM's `BlockTable`). A step then gathers its rows in one indexing op.

A block released outside a sliding window (a hole in the sequence's list) keeps its old id here:
attention never reads positions outside the window, so what that block now holds is never used.
Likewise a row handed to a new sequence keeps the previous owner's ids past the new one's blocks:
attention reads a sequence's blocks only up to its context length (the Triton kernels stop there,
the torch reference gathers further but masks those keys). Blocks given back at the tail (the slots of
speculative guesses that were not kept) are forgotten (`truncate`: the scheduler lists them with the next
step), so the ids that later replace them are written.
"""
from __future__ import annotations

import torch


class BlockTable:
    def __init__(self, max_num_seqs: int, max_blocks_per_seq: int):
        self.table = torch.zeros((max_num_seqs, max_blocks_per_seq), dtype=torch.int32)
        self.rows: dict[str, int] = {}                # request id -> its row
        self.num_written = [0] * max_num_seqs         # blocks of each row already written
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))

    def release(self, request_ids: list[str]) -> None:
        """Forget sequences that gave back their blocks (finished, aborted or preempted)."""
        for request_id in request_ids:
            row = self.rows.pop(request_id, None)
            if row is not None:
                self.free_rows.append(row)

    def truncate(self, num_blocks_kept: dict[str, int]) -> None:
        """Sequences that gave back blocks at their tail: the blocks that replace them must be written."""
        for request_id, kept in num_blocks_kept.items():
            row = self.rows.get(request_id)
            if row is not None:
                self.num_written[row] = min(self.num_written[row], kept)

    def row_of(self, seq) -> int:
        """The sequence's row, its new blocks written into it."""
        row = self.rows.get(seq.request_id)
        if row is None:
            row = self.rows[seq.request_id] = self.free_rows.pop()
            self.num_written[row] = 0
        blocks, written = seq.block_table, self.num_written[row]
        if len(blocks) > written:
            # New blocks are never holes (a window releases old ones), but a -1 must never reach a kernel.
            self.table[row, written:len(blocks)] = torch.tensor(blocks[written:], dtype=torch.int32).clamp_(min=0)
            self.num_written[row] = len(blocks)
        return row
