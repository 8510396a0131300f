"""CUDA graphs for decode steps: one launch replays a whole forward instead of ~2,000.

A batch-1 decode step of a 7B model is a few ms of GPU work wrapped in tens of ms of Python
and kernel launches (notebook 11 profiles it). A CUDA graph records every kernel of one
forward once, with arguments that point at fixed buffers; replaying it is a single launch.
Shapes are frozen at capture, hence the rules here:

- graphs are captured for a ladder of batch sizes (1, 2, 4, 8, 16, 32, ...); a step pads its
  batch up to the next size: padding rows have context length 0 and cache slot -1, which the
  Triton kernels skip;
- a step's inputs are copied into the graph's buffers, then the graph is replayed;
- only decode-only steps use graphs (prefill shapes vary too much to capture) and only with
  a backend that `supports_cuda_graphs`: the Triton one (the torch reference sizes its tensors from
  the step's longest context).

    >>> graphs = DecodeGraphs(model, max_batch=256, max_blocks_per_seq=64, block_size=16, device="cuda",
    ...                       build_metadata=model.attn_backend.build_metadata)
    >>> logits = graphs.run(input_ids, positions, meta)   # a decode-only step of <= max_batch sequences
"""
from __future__ import annotations

import torch

from ..attention import AttentionMetadata


def batch_size_ladder(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 16: padding wastes at most 15 rows of a large batch."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sizes + [max_batch]


class DecodeGraphs:
    @torch.inference_mode()
    def __init__(self, model, max_batch: int, max_blocks_per_seq: int, block_size: int, device, build_metadata):
        self.batch_sizes = batch_size_ladder(max_batch)
        self.max_batch = max_batch
        self.input_ids = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.int64, device=device)
        self.context_lens = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.cu_seqlens = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        # One logits buffer for every graph (each writes its first rows), not one per batch size.
        self.logits = torch.empty(max_batch, model.config.vocab_size, dtype=torch.float32, device=device)
        max_len = max_blocks_per_seq * block_size
        self.graphs, pool = {}, None
        # Largest first, all in one memory pool: a smaller graph reuses the larger one's memory.
        for bs in reversed(self.batch_sizes):
            # The backend's metadata, built once here from views of the buffers: a replay reads
            # whatever the buffers hold then.
            meta = build_metadata(AttentionMetadata(
                self.cu_seqlens[:bs + 1], self.context_lens[:bs], self.slot_mapping[:bs], self.block_tables[:bs],
                block_size, max_query_len=1, max_context_len=max_len, num_decodes=bs, max_decode_context_len=max_len))

            def forward():
                self.logits[:bs].copy_(model.compute_logits(model(self.input_ids[:bs], self.positions[:bs], meta)))

            forward()  # outside the capture: Triton compiles its kernels for these shapes now
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                forward()
            pool = graph.pool()
            self.graphs[bs] = graph

    def run(self, input_ids, positions, meta: AttentionMetadata) -> torch.Tensor:
        """Logits [n, vocab] of a decode-only step of n <= max_batch sequences, by replay."""
        n = input_ids.shape[0]
        bs = next(b for b in self.batch_sizes if b >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:bs].fill_(-1)
        self.context_lens[:n].copy_(meta.context_lens)
        self.context_lens[n:bs].zero_()
        self.block_tables[:n, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        self.graphs[bs].replay()
        return self.logits[:n]
