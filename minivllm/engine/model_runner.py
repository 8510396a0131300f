"""The model runner: turns the scheduled sequences into one flat batch and runs the model.

For every sequence it takes the tokens not yet in the cache (a whole prompt, a chunk of
one, or the single newest token), their positions, and the cache slot of each, then
calls the model once for all of them and returns the logits of each sequence's last
token: the only ones the sampler needs.
"""
from __future__ import annotations

import torch

from ..attention import AttentionMetadata, NoCacheMetadata


class ModelRunner:
    def __init__(self, model, block_size: int, device):
        self.model = model
        self.block_size = block_size
        self.device = device

    def prepare(self, seqs, num_new_tokens: list[int]):
        input_ids, positions, slots, cu_seqlens, context_lens = [], [], [], [0], []
        for seq, n in zip(seqs, num_new_tokens):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += [seq.block_table[p // self.block_size] * self.block_size + p % self.block_size
                      for p in range(start, end)]
            cu_seqlens.append(cu_seqlens[-1] + n)
            context_lens.append(end)
        width = max(len(s.block_table) for s in seqs)
        # Holes (blocks released outside a sliding window) and padding point at block 0:
        # attention masks those positions, so what block 0 holds is never used.
        block_tables = [[max(b, 0) for b in s.block_table] + [0] * (width - len(s.block_table)) for s in seqs]

        def to_device(x, dtype):
            return torch.tensor(x, dtype=dtype, device=self.device)

        num_decodes = next((i for i, n in enumerate(num_new_tokens) if n != 1), len(num_new_tokens))
        meta = AttentionMetadata(
            cu_seqlens_q=to_device(cu_seqlens, torch.int32), context_lens=to_device(context_lens, torch.int32),
            slot_mapping=to_device(slots, torch.int64), block_tables=to_device(block_tables, torch.int32),
            block_size=self.block_size, max_query_len=max(num_new_tokens), max_context_len=max(context_lens),
            num_decodes=num_decodes, max_decode_context_len=max(context_lens[:num_decodes], default=0))
        last_token_index = to_device(cu_seqlens[1:], torch.int64) - 1
        return to_device(input_ids, torch.int64), to_device(positions, torch.int64), meta, last_token_index

    @torch.inference_mode()
    def run(self, seqs, num_new_tokens: list[int]) -> torch.Tensor:
        """Logits [len(seqs), vocab] (float32) at the last new token of each sequence."""
        input_ids, positions, meta, last = self.prepare(seqs, num_new_tokens)
        hidden = self.model(input_ids, positions, meta)
        return self.model.compute_logits(hidden[last])

    @torch.inference_mode()
    def profile_run(self, num_tokens: int, max_len: int) -> None:
        """One forward of the largest step, without a cache, so that the memory it needs is
        known (torch.cuda.max_memory_allocated) before the KV cache takes the rest."""
        lens = [min(max_len, num_tokens - i) for i in range(0, num_tokens, max_len)]
        cu_seqlens = torch.tensor([0] + lens, device=self.device).cumsum(0).to(torch.int32)
        positions = torch.cat([torch.arange(n, device=self.device) for n in lens])
        hidden = self.model(torch.zeros_like(positions), positions, NoCacheMetadata(cu_seqlens, max(lens)))
        self.model.compute_logits(hidden[cu_seqlens[1:].long() - 1])
