"""Logprobs: each chosen token's log-probability and rank, and the N most likely tokens, batched on the device.

vLLM's meaning: `SamplingParams(logprobs=N)` asks, for every generated token, its logprob, its rank (1 =
the most likely) and the top N tokens with theirs; `prompt_logprobs=N` the same for each prompt token given
the tokens before it. They are computed from the raw logits the model gives, before penalties, bias,
temperature, top-k or top-p (vLLM's default `logprobs_mode`, "raw_logprobs"): what the model thinks,
not what the sampler drew from.

One `log_softmax` and one `topk` over the rows that ask (the sampled rows of requests with `logprobs`, then
the prompt positions of requests with `prompt_logprobs`), with k the largest N among them. Three small
tensors come back to the host with the step's sampled ids, in the same asynchronous copy: no extra wait.
On the host each position becomes arrays (ids, logprobs, ranks), the chosen token first.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..outputs import LogprobArrays


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [R, V] (raw), token_ids [R] the chosen (or, for a prompt, the next) token of each row ->
    (ids [R, 1 + k]: the chosen token then the top k; their logprobs [R, 1 + k]; the chosen token's rank [R])."""
    logprobs = logits.float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids[:, None])
    rank = (logprobs >= chosen).sum(dim=-1)  # vLLM's rank: tokens at least as likely, itself included
    top_logprobs, top_ids = logprobs.topk(k, dim=-1)
    return torch.cat([token_ids[:, None], top_ids], 1), torch.cat([chosen, top_logprobs], 1), rank


def to_arrays(ids: list[int], logprobs: list[float], rank: int, n: int) -> LogprobArrays:
    """One position: the chosen token (its rank), then the top n (ranks 1..n); the chosen one appears once."""
    out = {ids[0]: (logprobs[0], rank)}
    for r in range(1, n + 1):
        out.setdefault(ids[r], (logprobs[r], r))
    return list(out), [lp for lp, _ in out.values()], [r for _, r in out.values()]


@dataclass
class StepLogprobs:
    """The rows of one step that ask for logprobs, and their tensors on the device (then on the host).

    sampled: (row among the step's sampling sequences, N) for each request with `logprobs`;
    prompt: (sequence, first position, N, count) for each prefill chunk with `prompt_logprobs`, whose `count`
    rows (one per position of its `prompt_logprob_span`) follow the sampled ones."""
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
