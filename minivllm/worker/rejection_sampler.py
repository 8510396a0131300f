"""Rejection sampling (Leviathan et al., 2023): accept draft tokens so the output follows the target model.

Draft token `d_i`, drawn from `q_i`, is accepted with probability `min(1, p_i(d_i) / q_i(d_i))`; at the
first rejection a token is drawn from the normalised residual `max(p - q, 0)`; if all are accepted, a bonus
token is drawn from `p_k`. Greedy rows keep draft tokens while they equal the argmax. N-gram draft tokens
have a one-hot `q`. Seeded requests draw from their own generator.
"""
from __future__ import annotations

import torch

from .sampler import sampling_probs


def rejection_sample(probs: torch.Tensor, draft_tokens: torch.Tensor, num_drafts: torch.Tensor,
                     draft_probs: torch.Tensor | None, uniforms: torch.Tensor, races: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The accept/reject rule for B sequences at once.

    probs [B, K+1, V]; draft_tokens [B, K]; num_drafts [B]; draft_probs [B, K, V] or None (one-hot q);
    uniforms [B, K]; races [B, V] Exponential(1) noise. Returns (tokens [B, K+1], num_emitted [B])."""
    B, K1, V = probs.shape
    K = K1 - 1
    assert K >= 1, "a step with no guess at all is sampled by the ordinary sampler"
    positions = torch.arange(K, device=probs.device)
    is_draft = positions[None, :] < num_drafts[:, None]
    safe_tokens = torch.where(is_draft, draft_tokens, 0)
    p_guess = probs[:, :K].gather(-1, safe_tokens[..., None])[..., 0]                  # p_i(d_i)
    q_guess = (draft_probs.gather(-1, safe_tokens[..., None])[..., 0] if draft_probs is not None
               else torch.ones_like(p_guess))                                         # q_i(d_i)
    accepted = (uniforms * q_guess < p_guess) & is_draft                               # u < p / q
    num_accepted = accepted.int().cumprod(-1).sum(-1)
    rows = torch.arange(B, device=probs.device)
    p_last = probs[rows, num_accepted]
    if draft_probs is not None:
        q_last = draft_probs[rows, num_accepted.clamp(max=K - 1)]
    else:
        q_last = torch.nn.functional.one_hot(safe_tokens[rows, num_accepted.clamp(max=K - 1)], V).to(probs.dtype)
    rejected = num_accepted < num_drafts
    residual = (p_last - q_last).clamp_min(0)
    # Guard against an all-zero residual from rounding.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_last)
    last_dist = torch.where(rejected[:, None], residual, p_last)
    last_token = (last_dist / races).argmax(-1)
    tokens = torch.cat([torch.where(is_draft, draft_tokens, 0), torch.zeros_like(draft_tokens[:, :1])], dim=1)
    tokens[rows, num_accepted] = last_token
    return tokens, num_accepted + 1


def greedy_verify(argmax: list[int], drafts: list[list[int]]) -> list[list[int]]:
    """Greedy verification on the host: draft tokens while they equal the argmax, then the next argmax."""
    emitted, row = [], 0
    for draft in drafts:
        targets = argmax[row:row + len(draft) + 1]
        kept = 0
        while kept < len(draft) and draft[kept] == targets[kept]:
            kept += 1
        emitted.append(draft[:kept] + [targets[kept]])
        row += len(draft) + 1
    return emitted


class RejectionSampler:
    """Builds the inputs of `rejection_sample` from the sequences' params and generators."""

    def __init__(self, device, generator: torch.Generator):
        self.device = torch.device(device)
        self.generator = generator  # for requests without a seed

    def __call__(self, logits: torch.Tensor, seqs, drafts: list[list[int]],
                 draft_probs: torch.Tensor | None = None) -> list[list[int]]:
        """logits [sum(len(d) + 1), V] -> each sequence's emitted tokens."""
        params = [s.params for s in seqs]
        if all(p.greedy for p in params):
            return greedy_verify(logits.argmax(-1).tolist(), drafts)
        B, K = len(seqs), max(len(d) for d in drafts)
        rows_per_seq = torch.tensor([len(d) + 1 for d in drafts])
        per_row = torch.tensor([[p.temperature, p.top_k, p.top_p, p.min_p] for p in params], dtype=torch.float32)
        per_row = per_row.repeat_interleave(rows_per_seq, dim=0).to(self.device)
        probs_flat = sampling_probs(logits, per_row[:, 0], per_row[:, 1].long(), per_row[:, 2],
                                  per_row[:, 3] if any(p.min_p for p in params) else None)
        # [B, K+1, V]; rows past a sequence's own k + 1 stay zero and are masked.
        probs = torch.zeros(B, K + 1, logits.shape[-1], device=self.device, dtype=probs_flat.dtype)
        slot = torch.cat([torch.arange(n) for n in rows_per_seq.tolist()]).to(self.device)
        owner = torch.repeat_interleave(torch.arange(B), rows_per_seq).to(self.device)
        probs[owner, slot] = probs_flat
        draft_tokens = torch.tensor([d + [0] * (K - len(d)) for d in drafts], dtype=torch.int64, device=self.device)
        num_drafts = torch.tensor([len(d) for d in drafts], device=self.device)
        uniforms = torch.empty(B, K, device=self.device)
        races = torch.empty(B, logits.shape[-1], device=self.device)
        for b, seq in enumerate(seqs):
            generator = seq.generator or self.generator
            uniforms[b].uniform_(generator=generator)
            races[b].exponential_(generator=generator)
        if draft_probs is not None and draft_probs.shape[1] < K:
            draft_probs = torch.nn.functional.pad(draft_probs, (0, 0, 0, K - draft_probs.shape[1]))
        tokens, num_emitted = rejection_sample(probs, draft_tokens, num_drafts, draft_probs, uniforms, races)
        return [row[:n] for row, n in zip(tokens.tolist(), num_emitted.tolist())]
