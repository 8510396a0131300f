"""The model runner: turns the scheduled sequences into one flat batch and runs the model.

For every sequence it takes the tokens not yet in the cache (a whole prompt, a chunk of
one, or the single newest token), their positions, and the cache slot of each, then
calls the model once for all of them and returns the logits of each sequence's last
token: the only ones the sampler needs. Decode-only steps replay a CUDA graph when one was
captured (`capture_cuda_graphs`).
"""
from __future__ import annotations

from itertools import chain

import torch

from ..attention import AttentionMetadata, NoCacheMetadata
from ..cache.block_manager import cdiv
from .cuda_graphs import DecodeGraphs


class ModelRunner:
    def __init__(self, model, block_size: int, device):
        self.model = model
        self.block_size = block_size
        self.device = torch.device(device)
        self.graphs: DecodeGraphs | None = None

    def capture_cuda_graphs(self, max_batch: int, max_model_len: int) -> None:
        """Record decode steps as CUDA graphs (needs the Triton backend's kernels, a GPU)."""
        self.graphs = DecodeGraphs(self.model, max_batch, cdiv(max_model_len, self.block_size), self.block_size,
                                   self.device)

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
        block_tables = list(chain.from_iterable(s.block_table + [0] * (width - len(s.block_table)) for s in seqs))

        num_decodes = next((i for i, n in enumerate(num_new_tokens) if n != 1), len(num_new_tokens))
        max_context_len = max(context_lens)
        max_decode_context_len = max(context_lens[:num_decodes], default=0)

        # Everything travels in one host-to-device copy (from pinned memory on a GPU, so the copy
        # is asynchronous), then is cut into views: one transfer per step instead of six.
        fields = [input_ids, positions, slots, cu_seqlens, context_lens, cu_seqlens[1:], block_tables]
        host = torch.tensor(list(chain.from_iterable(fields)), dtype=torch.int64,
                            pin_memory=self.device.type == "cuda")
        # Holes in a block table (blocks released outside a sliding window, -1) point at block 0, as
        # the padding does: attention never reads those positions, so what block 0 holds is never used.
        host[len(host) - len(block_tables):].clamp_(min=0)
        flat = host.to(self.device, non_blocking=True)
        input_ids, positions, slots, cu_seqlens, context_lens, last, block_tables = flat.split(list(map(len, fields)))
        meta = AttentionMetadata(
            cu_seqlens_q=cu_seqlens.int(), context_lens=context_lens.int(), slot_mapping=slots,
            block_tables=block_tables.view(len(seqs), width).int(), block_size=self.block_size,
            max_query_len=max(num_new_tokens), max_context_len=max_context_len,
            num_decodes=num_decodes, max_decode_context_len=max_decode_context_len)
        return input_ids, positions, meta, last - 1

    @torch.inference_mode()
    def run(self, seqs, num_new_tokens: list[int]) -> torch.Tensor:
        """Logits [len(seqs), vocab] (float32) at the last new token of each sequence."""
        input_ids, positions, meta, last = self.prepare(seqs, num_new_tokens)
        if self.graphs is not None and meta.num_decodes == meta.num_seqs and meta.num_seqs <= self.graphs.max_batch:
            return self.graphs.run(input_ids, positions, meta)
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
