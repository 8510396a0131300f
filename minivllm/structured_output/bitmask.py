"""The grammar's bitmask applied to the logits, on the device: forbidden tokens get -inf before sampling.

xgrammar's bitmask holds one bit per token, 32 tokens per int32 word: token t is allowed when bit t % 32 of word
t // 32 is set. For a batch of 256 rows and a 49152-token vocabulary that is 1.5 MB to copy, against 48 MB
for a boolean mask. On the device one shift-and-and expands the words to bits, and one masked_fill sets the
forbidden logits to -inf (xgrammar's `apply_token_bitmask_inplace` does the same in a fused kernel; this torch
version runs on any device and reads in two lines). Greedy, temperature, top-k and top-p then only ever see
allowed tokens, and the penalties keep -inf at -inf.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GrammarBitmask:
    rows: list[int]        # the rows (of the step's sampling sequences) that follow a grammar
    bitmask: torch.Tensor  # [len(rows), ceil(vocab / 32)] int32, on the host (pinned on a GPU)

    def apply(self, logits: torch.Tensor, row_index: list[int] | None = None) -> torch.Tensor:
        """logits [N, V] -> a new tensor, each grammar row's forbidden tokens at -inf. `row_index[i]`: the logits
        row of sampling sequence i (a verify step has several rows per sequence); None: row i is sequence i."""
        device, V = logits.device, logits.shape[-1]
        rows = self.rows if row_index is None else [row_index[i] for i in self.rows]
        rows = torch.tensor(rows, device=device)
        words = self.bitmask.to(device, non_blocking=True)
        shifts = torch.arange(32, device=device, dtype=torch.int32)
        allowed = ((words[:, :, None] >> shifts) & 1).view(len(self.rows), -1)[:, :V].bool()
        logits = logits.clone()
        logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
        return logits


def allowed_tokens(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The ids one bitmask row allows (for tests and notebooks: what the mask lets through)."""
    bits = (bitmask_row[:, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab_size].nonzero().flatten()
