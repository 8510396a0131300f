"""Rejection sampling: keep the draft's guesses the target model agrees with, and sample as the target would.

A verify step gives the target's distribution at every position of `[last token, d1 .. dk]`: `p_0` (what
follows the last token, where `d1` was guessed), `p_1` (after `d1`), ..., `p_k`. The guesses are checked in
order (Leviathan et al., 2023, "Fast Inference from Transformers via Speculative Decoding"):

- guess `d_i`, drawn by the proposer from `q_i`, is kept with probability `min(1, p(d_i) / q(d_i))`;
- at the first guess thrown away, the token is drawn from the residual `max(p - q, 0)`, renormalised;
- if every guess is kept, one more token is drawn from `p_k` (the bonus: k + 1 tokens for one forward).

Each emitted token is then distributed exactly as the target alone would have sampled it. Greedy rows are
the special case where `p` is one-hot on the argmax: a guess is kept when it is the argmax, and the first
other token is replaced by the argmax, so greedy text is identical with and without speculation. The n-gram
proposer guesses deterministically: its `q` is one-hot on its guess, so a guess is kept with probability
`p(d_i)` and a rejected one is removed from `p` before drawing.

Draws use the "exponential race" of the sampler (`argmax(p / E)`), uniforms and races from each request's
own generator when it has a seed, so seeded requests reproduce.
"""
from __future__ import annotations

import torch

from .sampler import sampling_probs


def rejection_sample(probs: torch.Tensor, draft_tokens: torch.Tensor, num_drafts: torch.Tensor,
                     draft_probs: torch.Tensor | None, uniforms: torch.Tensor, races: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The accept/reject rule for B sequences at once.

    probs [B, K+1, V]: the target's distributions; draft_tokens [B, K] (padding past num_drafts is ignored);
    num_drafts [B]; draft_probs [B, K, V] or None (deterministic guesses: one-hot q); uniforms [B, K] in [0, 1);
    races [B, V] Exponential(1) noise for the one token drawn per row.
    Returns (tokens [B, K+1], num_emitted [B]): row b emits tokens[b, :num_emitted[b]] (accepted guesses,
    then the corrected or bonus token)."""
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
    num_accepted = accepted.int().cumprod(-1).sum(-1)                                   # the leading run
    # The distribution of the one drawn token: the residual at the first rejection, or p_K after all.
    rows = torch.arange(B, device=probs.device)
    p_last = probs[rows, num_accepted]
    if draft_probs is not None:  # (for a row with no guess left, `rejected` below ignores q_last)
        q_last = draft_probs[rows, num_accepted.clamp(max=K - 1)]
    else:
        q_last = torch.nn.functional.one_hot(safe_tokens[rows, num_accepted.clamp(max=K - 1)], V).to(probs.dtype)
    rejected = num_accepted < num_drafts
    residual = (p_last - q_last).clamp_min(0)
    # (A residual of all zeros cannot happen when the rejected guess had p < q; guard against rounding.)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_last)
    last_dist = torch.where(rejected[:, None], residual, p_last)
    last_token = (last_dist / races).argmax(-1)
    tokens = torch.cat([torch.where(is_draft, draft_tokens, 0), torch.zeros_like(draft_tokens[:, :1])], dim=1)
    tokens[rows, num_accepted] = last_token
    return tokens, num_accepted + 1


def greedy_verify(argmax: list[int], drafts: list[list[int]]) -> list[list[int]]:
    """The rule for greedy rows only, on the host: the guesses equal to the model's argmax, then its next
    argmax. `argmax` holds each sequence's len(draft) + 1 rows in turn."""
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
    """Builds the per-row inputs of `rejection_sample` from the sequences (their parameters, generators)."""

    def __init__(self, device, generator: torch.Generator):
        self.device = torch.device(device)
        self.generator = generator  # the engine's default stream, for requests without a seed

    def __call__(self, logits: torch.Tensor, seqs, drafts: list[list[int]],
                 draft_probs: torch.Tensor | None = None) -> list[list[int]]:
        """logits [sum(len(d) + 1), V]: each sequence's k + 1 rows in turn. Returns each sequence's emitted tokens."""
        params = [s.params for s in seqs]
        if all(p.greedy for p in params):  # p is one-hot: keep guesses while they are the argmax (no softmax)
            return greedy_verify(logits.argmax(-1).tolist(), drafts)
        B, K = len(seqs), max(len(d) for d in drafts)
        rows_per_seq = torch.tensor([len(d) + 1 for d in drafts])
        per_row = torch.tensor([[p.temperature, p.top_k, p.top_p, p.min_p] for p in params], dtype=torch.float32)
        per_row = per_row.repeat_interleave(rows_per_seq, dim=0).to(self.device)
        probs_flat = sampling_probs(logits, per_row[:, 0], per_row[:, 1].long(), per_row[:, 2],
                                  per_row[:, 3] if any(p.min_p for p in params) else None)
        # Into [B, K+1, V], rows past a sequence's own k + 1 left as zeros (never read: is_draft masks them).
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
