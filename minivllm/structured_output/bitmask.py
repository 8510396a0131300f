"""The grammar's bitmask applied to the logits: forbidden tokens get -inf before sampling.

xgrammar packs 32 tokens per int32 word (token t: bit t % 32 of word t // 32).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GrammarBitmask:
    rows: list[int]        # indices of the step's sampled sequences that have a grammar
    bitmask: torch.Tensor  # [len(rows), ceil(vocab / 32)] int32, on the host

    def apply(self, logits: torch.Tensor, row_index: list[int] | None = None) -> torch.Tensor:
        """logits [N, V] -> a new tensor with forbidden tokens at -inf. `row_index[i]` is the logits row of
        sampled sequence i (default: row i)."""
        rows = self.rows if row_index is None else [row_index[i] for i in self.rows]
        if logits.device.type == "cpu":
            import xgrammar

            words = torch.full((logits.shape[0], self.bitmask.shape[1]), -1, dtype=torch.int32)
            words[rows] = self.bitmask
            logits = logits.clone()
            xgrammar.apply_token_bitmask_inplace(logits, words, indices=rows)
            return logits
        return mask_logits(logits, rows, self.bitmask.to(logits.device, non_blocking=True))


def mask_logits(logits: torch.Tensor, rows: list[int], words: torch.Tensor) -> torch.Tensor:
    """The mask in torch, on any device: `words` [len(rows), ceil(V / 32)] int32."""
    V = logits.shape[-1]
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((words[:, :, None] >> shifts) & 1).view(len(rows), -1)[:, :V].bool()
    if rows == list(range(logits.shape[0])):
        return logits.masked_fill(~allowed, float("-inf"))
    index = torch.tensor(rows, device=logits.device)
    logits = logits.clone()
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return logits


def allowed_tokens(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The token ids one bitmask row allows."""
    bits = (bitmask_row[:, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab_size].nonzero().flatten()
