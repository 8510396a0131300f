"""The running sequences' block tables, in one persistent host tensor (vLLM's `BlockTable`).

Each sequence keeps a row, and a step writes only the blocks added since the last one, instead of
rebuilding the table from Python lists. Stale ids (blocks freed outside a sliding window, a previous
owner's blocks past the context length) are never read by attention.
"""
from __future__ import annotations

import torch


class BlockTable:
    def __init__(self, max_num_seqs: int, max_blocks_per_seq: int):
        self.table = torch.zeros((max_num_seqs, max_blocks_per_seq), dtype=torch.int32)
        self.rows: dict[str, int] = {}                # request id -> row
        self.num_written = [0] * max_num_seqs
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))

    def release(self, request_ids: list[str]) -> None:
        """Free the rows of finished, aborted or preempted sequences."""
        for request_id in request_ids:
            row = self.rows.pop(request_id, None)
            if row is not None:
                self.free_rows.append(row)

    def truncate(self, num_blocks_kept: dict[str, int]) -> None:
        """Mark blocks freed at a sequence's tail (rejected draft tokens) for rewriting."""
        for request_id, kept in num_blocks_kept.items():
            row = self.rows.get(request_id)
            if row is not None:
                self.num_written[row] = min(self.num_written[row], kept)

    def row_of(self, seq) -> int:
        """The sequence's row, with its new blocks written."""
        row = self.rows.get(seq.request_id)
        if row is None:
            row = self.rows[seq.request_id] = self.free_rows.pop()
            self.num_written[row] = 0
        blocks, written = seq.block_table, self.num_written[row]
        if len(blocks) > written:
            # Never pass -1 (a freed block) to a kernel. One new block (a decode's) is written as a scalar:
            # building a tensor for it costs the host more than the write.
            if len(blocks) == written + 1:
                self.table[row, written] = max(blocks[written], 0)
            else:
                self.table[row, written:len(blocks)] = torch.tensor(blocks[written:], dtype=torch.int32).clamp_(min=0)
            self.num_written[row] = len(blocks)
        return row
