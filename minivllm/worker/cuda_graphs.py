"""CUDA graphs for decode and verify steps: one launch replays a whole forward.

A graph records a forward's kernels once, reading fixed buffers, so its shape is frozen: (query_len,
batch), with query_len 1 for decodes and k + 1 for verifies with k draft tokens. `choose_graph` picks
the smallest query_len that fits and the next batch size up. Inputs are copied into the buffers with
padding at the end (slot -1, empty sequences), which the kernels skip; a sequence with fewer tokens
than query_len needs no padding, as the prefill kernel reads its length from cu_seqlens. All graphs
share one memory pool and one logits buffer. Requires a backend that `supports_cuda_graphs`.
"""
from __future__ import annotations

import functools

import torch

from ..attention import AttentionMetadata


def batch_size_ladder(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to `max_batch`."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sizes + [max_batch]


# Verify graphs hold at most this many tokens (or `max_batch`), like decode graphs at the default
# max_num_seqs, so they need no extra memory.
MAX_VERIFY_GRAPH_TOKENS = 256


def graph_ladders(max_batch: int, num_speculative_tokens: int = 0) -> dict[int, list[int]]:
    """The batch sizes captured for each query length (1 for decodes, k + 1 for verifies)."""
    ladders = {1: batch_size_ladder(max_batch)}
    if num_speculative_tokens:
        q = num_speculative_tokens + 1
        ladders[q] = batch_size_ladder(min(max_batch, max(1, max(max_batch, MAX_VERIFY_GRAPH_TOKENS) // q)))
    return ladders


def choose_graph(ladders: dict[int, list[int]], num_seqs: int, max_query_len: int) -> tuple[int, int] | None:
    """(query_len, batch) of the graph for this step, or None to run it eagerly."""
    for q in sorted(ladders):
        if max_query_len <= q:
            ladder = ladders[q]
            return (q, next(b for b in ladder if b >= num_seqs)) if num_seqs <= ladder[-1] else None
    return None


class GraphBuffers:
    """The fixed input buffers every graph reads, sized for the largest shape."""

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, block_size: int, device):
        self.block_size = block_size
        self.max_len = max_blocks_per_seq * block_size
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)
        self.context_lens = torch.zeros(max_seqs, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_seqs, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.cu_seqlens = torch.zeros(max_seqs + 1, dtype=torch.int32, device=device)

    def metadata(self, query_len: int, batch: int) -> AttentionMetadata:
        """Metadata over views of the buffers; only query_len 1 uses the decode kernel."""
        decode = query_len == 1
        return AttentionMetadata(
            self.cu_seqlens[:batch + 1], self.context_lens[:batch], self.slot_mapping[:batch * query_len],
            self.block_tables[:batch], self.block_size, max_query_len=query_len, max_context_len=self.max_len,
            num_decodes=batch if decode else 0, max_decode_context_len=self.max_len if decode else 0)

    def load(self, shape: tuple[int, int], input_ids, positions, meta: AttentionMetadata) -> None:
        """Copy a step's inputs into the buffers, padded to `shape` at the end."""
        query_len, batch = shape
        t, n = input_ids.shape[0], meta.num_seqs
        self.input_ids[:t].copy_(input_ids)
        self.positions[:t].copy_(positions)
        self.slot_mapping[:t].copy_(meta.slot_mapping)
        self.slot_mapping[t:batch * query_len].fill_(-1)
        self.context_lens[:n].copy_(meta.context_lens)
        self.context_lens[n:batch].zero_()
        self.cu_seqlens[:n + 1].copy_(meta.cu_seqlens_q)
        self.cu_seqlens[n + 1:batch + 1].fill_(t)  # padding sequences are empty
        self.block_tables[:n, :meta.block_tables.shape[1]].copy_(meta.block_tables)


def padded_forward(model, buffers: GraphBuffers, shape: tuple[int, int], build_metadata) -> torch.Tensor:
    """The forward a graph records: logits [query_len * batch, vocab], padding rows included. Metadata is
    built inside so what it derives from the buffers is recomputed on every replay."""
    query_len, batch = shape
    t = query_len * batch
    hidden = model(buffers.input_ids[:t], buffers.positions[:t], build_metadata(buffers.metadata(query_len, batch)))
    return model.compute_logits(hidden)


class CUDAGraphs:
    @torch.inference_mode()
    def __init__(self, model, max_batch: int, max_blocks_per_seq: int, block_size: int, device, build_metadata,
                 num_speculative_tokens: int = 0, pool=None):
        self.ladders = graph_ladders(max_batch, num_speculative_tokens)
        shapes = [(q, b) for q, ladder in self.ladders.items() for b in ladder]
        max_tokens = max(q * b for q, b in shapes)
        self.buffers = GraphBuffers(max_tokens, max_batch, max_blocks_per_seq, block_size, device)
        self.logits = torch.empty(max_tokens, model.config.vocab_size, dtype=torch.float32, device=device)
        self.graphs, self._pool = {}, pool
        # Largest first, so smaller graphs reuse the shared pool's memory.
        for shape in sorted(shapes, key=lambda s: s[0] * s[1], reverse=True):
            self.graphs[shape] = self._capture(functools.partial(self._forward, model, shape, build_metadata))

    def _forward(self, model, shape: tuple[int, int], build_metadata) -> None:
        self.logits[:shape[0] * shape[1]].copy_(padded_forward(model, self.buffers, shape, build_metadata))

    def _capture(self, forward) -> torch.cuda.CUDAGraph:
        """`forward` recorded as a graph in the shared pool."""
        forward()  # warm-up: Triton compiles its kernels outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            forward()
        self._pool = graph.pool()
        return graph

    def run(self, shape: tuple[int, int], input_ids, positions, meta: AttentionMetadata) -> torch.Tensor:
        """Logits [tokens, vocab] of the step, by replay."""
        self.buffers.load(shape, input_ids, positions, meta)
        self.graphs[shape].replay()
        return self.logits[:input_ids.shape[0]]
