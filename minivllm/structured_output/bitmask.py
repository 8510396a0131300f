"""The grammar's bitmask applied to the logits, on the device: forbidden tokens get -inf before sampling.

xgrammar's bitmask holds one bit per token, 32 tokens per int32 word: token t is allowed when bit t % 32 of word
t // 32 is set. For a batch of 256 rows and a 49152-token vocabulary that is 1.5 MB to copy, against 12.6 MB
for a boolean mask. On the device one shift-and-and expands the words to bits, and one masked_fill sets the
forbidden logits to -inf (`mask_logits`: it runs on any device and reads in a few lines). On a CPU, xgrammar's
`apply_token_bitmask_inplace` does the same in C++, without the temporaries (several times faster at batch 256).
Greedy, temperature, top-k and top-p then only ever see allowed tokens, and the penalties keep -inf at -inf.
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
        rows = self.rows if row_index is None else [row_index[i] for i in self.rows]
        if logits.device.type == "cpu":  # xgrammar's C++ kernel: the torch version's temporaries cost 3x here
            import xgrammar

            words = torch.full((logits.shape[0], self.bitmask.shape[1]), -1, dtype=torch.int32)
            words[rows] = self.bitmask
            logits = logits.clone()
            xgrammar.apply_token_bitmask_inplace(logits, words, indices=rows)
            return logits
        return mask_logits(logits, rows, self.bitmask.to(logits.device, non_blocking=True))


def mask_logits(logits: torch.Tensor, rows: list[int], words: torch.Tensor) -> torch.Tensor:
    """The mask in torch, on the logits' device: `words` [len(rows), ceil(V / 32)] int32 -> bits -> -inf."""
    V = logits.shape[-1]
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((words[:, :, None] >> shifts) & 1).view(len(rows), -1)[:, :V].bool()
    if rows == list(range(logits.shape[0])):  # every row (a batch of constrained requests): no gather
        return logits.masked_fill(~allowed, float("-inf"))
    index = torch.tensor(rows, device=logits.device)
    logits = logits.clone()
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return logits


def allowed_tokens(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The ids one bitmask row allows (for tests and notebooks: what the mask lets through)."""
    bits = (bitmask_row[:, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab_size].nonzero().flatten()
