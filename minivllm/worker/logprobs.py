"""Logprobs: each token's log-probability and rank, plus the top N tokens, batched on the device.

Computed from the raw logits, before any processing or temperature (vLLM's default `logprobs_mode`,
"raw_logprobs"), for sampled tokens (`logprobs=N`) and prompt tokens (`prompt_logprobs=N`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..outputs import LogprobArrays


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [R, V], token_ids [R] -> (ids [R, 1 + k]: each token then the top k; their logprobs; ranks [R])."""
    logprobs = logits.float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids[:, None])
    rank = (logprobs >= chosen).sum(dim=-1)  # vLLM's rank: 1 = most likely
    top_logprobs, top_ids = logprobs.topk(k, dim=-1)
    return torch.cat([token_ids[:, None], top_ids], 1), torch.cat([chosen, top_logprobs], 1), rank


def to_arrays(ids: list[int], logprobs: list[float], rank: int, n: int) -> LogprobArrays:
    """One position: the chosen token, then the top n, without duplicates."""
    out = {ids[0]: (logprobs[0], rank)}
    for r in range(1, n + 1):
        out.setdefault(ids[r], (logprobs[r], r))
    return list(out), [lp for lp, _ in out.values()], [r for _, r in out.values()]


@dataclass
class StepLogprobs:
    """A step's logprob rows and tensors. sampled: (sampling row, N); prompt: (sequence, first position,
    N, count), whose rows follow the sampled ones."""
    sampled: list[tuple[int, int]]
    prompt: list[tuple[object, int, int, int]]
    tensors: list[torch.Tensor]

    def on_host(self, host: list[torch.Tensor], num_rows: int):
        """-> (arrays or None per sampling row, [(sequence, first position, [arrays per position])])."""
        ids, logprobs, ranks = (t.tolist() for t in host)
        per_row: list[LogprobArrays | None] = [None] * num_rows
        for i, (row, n) in enumerate(self.sampled):
            per_row[row] = to_arrays(ids[i], logprobs[i], ranks[i], n)
        prompt, i = [], len(self.sampled)
        for seq, first, n, count in self.prompt:
            prompt.append((seq, first, [to_arrays(ids[j], logprobs[j], ranks[j], n) for j in range(i, i + count)]))
            i += count
        return per_row, prompt
