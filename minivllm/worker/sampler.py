"""The sampler: next tokens for a whole batch at once, on the device.

Logits processing (penalties, bias, min_tokens), temperature, top-k, top-p and min-p are batched tensor
ops with one value per row. Sampling uses the exponential race `argmax(p / E)`, `E ~ Exponential(1)`
(a form of the Gumbel-max trick); seeded requests draw `E` from their own generator.
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
    # Keep a token while the mass before it is below top_p (so the top token is always kept).
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def process_logits(logits: torch.Tensor, seqs, rows: list[int], eos_token_ids,
                   in_flight: torch.Tensor | None = None) -> torch.Tensor:
    """A new logits tensor with `rows` processed (penalties, bias, min_tokens). `in_flight` [B]: each row's
    output token still being sampled on the device (-1: none)."""
    device, V = logits.device, logits.shape[-1]
    R = len(rows)
    params = [seqs[b].params for b in rows]
    # Flat (row, token) pairs for output tokens, prompt tokens, biases and banned stop tokens.
    out_r, out_t, prompt_r, prompt_t, bias_r, bias_t, bias_v, ban_r, ban_t = ([] for _ in range(9))
    for r, (b, p) in enumerate(zip(rows, params)):
        seq = seqs[b]
        answer = seq.output_token_ids
        out_r += [r] * len(answer)
        out_t += answer
        if p.repetition_penalty != 1:
            prompt_r += [r] * seq.num_prompt_tokens
            prompt_t += seq.prompt_token_ids
        for token, value in (p.logit_bias or {}).items():
            bias_r.append(r), bias_t.append(token), bias_v.append(value)
        in_flight_count = max(seq.num_output_placeholders - 1, 0)
        if seq.num_output_tokens + in_flight_count < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            ban_r += [r] * len(stops)
            ban_t += sorted(stops)
    per_row = torch.tensor([[p.presence_penalty, p.frequency_penalty, p.repetition_penalty] for p in params])
    index = torch.tensor([len(out_r), len(prompt_r), len(bias_r), len(ban_r)])
    flat = torch.tensor(out_r + out_t + prompt_r + prompt_t + bias_r + bias_t + ban_r + ban_t, dtype=torch.int64)
    per_row, flat = per_row.to(device), flat.to(device)
    n_out, n_prompt, n_bias, n_ban = index.tolist()
    out_r, out_t, prompt_r, prompt_t, bias_r, bias_t, ban_r, ban_t = flat.split(
        [n_out, n_out, n_prompt, n_prompt, n_bias, n_bias, n_ban, n_ban])
    presence, frequency, repetition = per_row.unbind(1)
    counts = torch.zeros(R, V, device=device)
    counts.index_put_((out_r, out_t), torch.ones_like(out_r, dtype=counts.dtype), accumulate=True)
    if in_flight is not None:  # a scatter, since a boolean mask would sync
        token = in_flight[rows]
        counts.scatter_add_(1, token.clamp(min=0)[:, None], (token >= 0).to(counts.dtype)[:, None])
    seen = counts > 0
    seen[prompt_r, prompt_t] = True
    x = logits[rows]
    x = torch.where(seen, torch.where(x > 0, x / repetition[:, None], x * repetition[:, None]), x)
    x = x - frequency[:, None] * counts - presence[:, None] * (counts > 0).to(x.dtype)
    x = x.index_put((bias_r, bias_t), torch.tensor(bias_v, device=device, dtype=x.dtype), accumulate=True)
    x[ban_r, ban_t] = float("-inf")
    logits = logits.clone()
    logits[rows] = x
    return logits


def sampling_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   min_p: torch.Tensor | None = None, filter_top: bool = True) -> torch.Tensor:
    """[R, V] logits -> [R, V] each row's sampling distribution: one-hot on the argmax when greedy, else the
    softmax after temperature, top-k, top-p and min-p. `filter_top=False` skips top-k/top-p."""
    greedy = torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)
    logits = logits / temperature.clamp_min(1e-5)[:, None]
    if filter_top:
        logits = apply_top_k_top_p(logits, top_k, top_p)
    probs = logits.softmax(dim=-1)
    if min_p is not None:
        probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.where((temperature == 0)[:, None], greedy, probs)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           generators: list, default_generator: torch.Generator | None = None,
           filter_top: bool = True, min_p: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V]; per-row params [B]; one generator or None per row. Returns [B] int64 tokens."""
    probs = sampling_probs(logits, temperature, top_k, top_p, min_p, filter_top)
    race = torch.empty_like(probs).exponential_(generator=default_generator)
    for row, generator in enumerate(generators):
        if generator is not None:
            race[row].exponential_(generator=generator)
    return (probs / race).argmax(dim=-1)


class Sampler:
    """Builds the per-row parameter tensors from the sequences and calls `sample`."""

    def __init__(self, device, seed: int = 0, eos_token_ids=()):
        self.device = torch.device(device)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.eos_token_ids = tuple(eos_token_ids)  # banned before min_tokens

    def __call__(self, logits: torch.Tensor, seqs, processed_rows: list[int] = (),
                 in_flight: torch.Tensor | None = None) -> torch.Tensor:
        """`processed_rows`: rows whose requests need logits processing."""
        if processed_rows:
            logits = process_logits(logits, seqs, processed_rows, self.eos_token_ids, in_flight)
        params = [s.params for s in seqs]
        if all(p.greedy for p in params):
            return logits.argmax(dim=-1)
        host = torch.tensor([[p.temperature, p.top_k, p.top_p, p.min_p] for p in params], dtype=torch.float32,
                            pin_memory=self.device.type == "cuda")
        temperature, top_k, top_p, min_p = host.to(self.device, non_blocking=True).unbind(1)
        top_k = top_k.long()
        return sample(logits, temperature, top_k, top_p, [s.generator for s in seqs], self.generator,
                      filter_top=any(p.top_k > 0 or p.top_p < 1 for p in params),
                      min_p=min_p if any(p.min_p for p in params) else None)
