"""The sampler: next tokens for a whole batch at once, on the device.

Greedy, temperature, top-k, top-p and min-p are tensor operations over `[batch, vocab]`, with
one value per row, so a batch mixing greedy and sampled requests costs one pass. Before them, the
rows of requests that ask for it get their logits processed (`process_logits`: presence, frequency
and repetition penalties, logit bias, min_tokens), batched on the device too; a batch where nobody
asks skips it.
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


def process_logits(logits: torch.Tensor, seqs, rows: list[int], eos_token_ids,
                   in_flight: torch.Tensor | None = None) -> torch.Tensor:
    """`rows` (those whose requests ask for penalties, a bias or min_tokens) processed: a new tensor, the other
    rows as they were. `in_flight` [B]: the token each row's sequence sampled in the step still on the device
    (-1 for none), which already belongs to its answer. One host-to-device copy of flat indices."""
    device, V = logits.device, logits.shape[-1]
    R = len(rows)
    params = [seqs[b].params for b in rows]
    # Flat (row, token) pairs: the answers' tokens, the prompts' tokens, the biases, the banned stops.
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
        if seq.num_output_tokens + in_flight_count < p.min_tokens:  # no end yet
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
    if in_flight is not None:  # (a scatter, not a mask: a mask's size would make the host wait for the GPU)
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
    """[R, V] logits -> [R, V] the distribution each row draws from: one-hot on the argmax for temperature 0
    (greedy), else the softmax of the temperature-scaled logits after top-k, top-p and min-p. The sampler
    draws from it; the rejection sampler of speculative decoding checks guesses against it. `filter_top=False`
    skips the sort when the caller knows (from the host-side params: asking the device would cost a
    synchronisation) that no row uses top-k or top-p."""
    greedy = torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)
    logits = logits / temperature.clamp_min(1e-5)[:, None]  # greedy rows are replaced below
    if filter_top:
        logits = apply_top_k_top_p(logits, top_k, top_p)
    probs = logits.softmax(dim=-1)
    if min_p is not None:  # drop tokens less likely than min_p times the most likely one
        probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.where((temperature == 0)[:, None], greedy, probs)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           generators: list, default_generator: torch.Generator | None = None,
           filter_top: bool = True, min_p: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V] float32; per-row temperature/top_k/top_p (and min_p) [B]; generators: one per row or
    None. Returns the next token of each row, [B] int64."""
    probs = sampling_probs(logits, temperature, top_k, top_p, min_p, filter_top)
    race = torch.empty_like(probs).exponential_(generator=default_generator)
    for row, generator in enumerate(generators):
        if generator is not None:
            race[row].exponential_(generator=generator)
    return (probs / race).argmax(dim=-1)  # a greedy row's one-hot picks its argmax whatever the race


class Sampler:
    """Builds the per-row parameter tensors from the sequences, then calls `sample`."""

    def __init__(self, device, seed: int = 0, eos_token_ids=()):
        self.device = torch.device(device)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.eos_token_ids = tuple(eos_token_ids)  # what min_tokens holds back (with each request's stop ids)

    def __call__(self, logits: torch.Tensor, seqs, processed_rows: list[int] = (),
                 in_flight: torch.Tensor | None = None) -> torch.Tensor:
        """`processed_rows`: the rows whose requests process their logits (found by the caller, in its one
        pass over the batch)."""
        if processed_rows:
            logits = process_logits(logits, seqs, processed_rows, self.eos_token_ids, in_flight)
        params = [s.params for s in seqs]
        if all(p.greedy for p in params):  # no per-row tensors to send to the device
            return logits.argmax(dim=-1)
        # The per-row parameters travel in one copy (pinned on a GPU, so it does not block).
        host = torch.tensor([[p.temperature, p.top_k, p.top_p, p.min_p] for p in params], dtype=torch.float32,
                            pin_memory=self.device.type == "cuda")
        temperature, top_k, top_p, min_p = host.to(self.device, non_blocking=True).unbind(1)
        top_k = top_k.long()
        return sample(logits, temperature, top_k, top_p, [s.generator for s in seqs], self.generator,
                      filter_top=any(p.top_k > 0 or p.top_p < 1 for p in params),
                      min_p=min_p if any(p.min_p for p in params) else None)
