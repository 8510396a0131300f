"""The sampler: next tokens for a whole batch at once, on the device.

Greedy, temperature, top-k and top-p are tensor operations over `[batch, vocab]`, with
one value per row, so a batch mixing greedy and sampled requests costs one pass.
Sampling uses the "exponential race": `argmax(p / E)` with `E ~ Exponential(1)` draws a
token with probability `p` (the Gumbel-max trick in another form). A request with a seed
draws its `E` from its own generator, so its tokens do not depend on its batch-mates.
"""
from __future__ import annotations

import torch


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit outside each row's top-k and top-p sets (top_k < 1 = off)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)
    k = torch.where(top_k < 1, logits.shape[-1], top_k)
    sorted_logits = sorted_logits.masked_fill(rank[None, :] >= k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # A token is kept while the mass of the more likely tokens has not reached top_p yet;
    # the most likely token is therefore always kept.
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           generators: list, default_generator: torch.Generator | None = None,
           filter_top: bool = True) -> torch.Tensor:
    """logits [B, V] float32; per-row temperature/top_k/top_p [B]; generators: one per row or None.
    Returns the next token of each row, [B] int64. `filter_top=False` skips the sort when the
    caller knows (from the host-side params: asking the device would cost a synchronisation)
    that no row uses top-k or top-p."""
    greedy_tokens = logits.argmax(dim=-1)
    logits = logits / temperature.clamp_min(1e-5)[:, None]  # greedy rows are replaced below
    if filter_top:
        logits = apply_top_k_top_p(logits, top_k, top_p)
    probs = logits.softmax(dim=-1)
    race = torch.empty_like(probs).exponential_(generator=default_generator)
    for row, generator in enumerate(generators):
        if generator is not None:
            race[row].exponential_(generator=generator)
    sampled = (probs / race).argmax(dim=-1)
    return torch.where(temperature == 0, greedy_tokens, sampled)


class Sampler:
    """Builds the per-row parameter tensors from the sequences, then calls `sample`."""

    def __init__(self, device, seed: int = 0):
        self.device = torch.device(device)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, seqs) -> torch.Tensor:
        params = [s.params for s in seqs]
        if all(p.greedy for p in params):  # no per-row tensors to send to the device
            return logits.argmax(dim=-1)
        # The three per-row parameters travel in one copy (pinned on a GPU, so it does not block).
        host = torch.tensor([[p.temperature, p.top_k, p.top_p] for p in params], dtype=torch.float32,
                            pin_memory=self.device.type == "cuda")
        temperature, top_k, top_p = host.to(self.device, non_blocking=True).unbind(1)
        top_k = top_k.long()
        return sample(logits, temperature, top_k, top_p, [s.generator for s in seqs], self.generator,
                      filter_top=any(p.top_k > 0 or p.top_p < 1 for p in params))
