"""CUDA graphs: one launch replays a whole forward, for decode, verify and mixed steps.

A graph records a forward's kernels once, reading fixed buffers, so its shape is frozen. Decode and verify
graphs are keyed (query_len, batch), with query_len 1 for decodes and k + 1 for verifies with k draft tokens,
and record the logits of every row; `choose_graph` picks the smallest query_len that fits and the next batch
size up. A mixed step (prompt chunks, with or without decodes) takes the graph of the next token count up on
`token_ladder`, recorded for as many sequences as that count allows: the attention kernels' launches depend on
the numbers of tokens and sequences only, not on how the tokens are shared out, so one graph serves any mix;
it records the final hidden states, and the logits of the sampling rows are computed after it.
Inputs are copied into the buffers with padding at the end (slot -1, empty sequences), which the kernels
skip; a sequence with fewer tokens than query_len needs no padding, as the kernels read its length from
cu_seqlens. All graphs share one memory pool. Requires a backend that `supports_cuda_graphs`.
"""
from __future__ import annotations

import bisect
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
# Mixed steps past this many tokens run eagerly: there the GPU's work outlasts the host's launches.
MAX_MIXED_GRAPH_TOKENS = 2048


def graph_ladders(max_batch: int, num_speculative_tokens: int = 0) -> dict[int, list[int]]:
    """The batch sizes captured for each query length (1 for decodes, k + 1 for verifies)."""
    ladders = {1: batch_size_ladder(max_batch)}
    if num_speculative_tokens:
        q = num_speculative_tokens + 1
        ladders[q] = batch_size_ladder(min(max_batch, max(1, max(max_batch, MAX_VERIFY_GRAPH_TOKENS) // q)))
    return ladders


def choose_graph(ladders: dict[int, list[int]], num_seqs: int, max_query_len: int) -> tuple[int, int] | None:
    """(query_len, batch) of the decode or verify graph for this step, or None."""
    for q in sorted(ladders):
        if max_query_len <= q:
            ladder = ladders[q]
            return (q, next(b for b in ladder if b >= num_seqs)) if num_seqs <= ladder[-1] else None
    return None


def token_ladder(max_tokens: int) -> list[int]:
    """The token counts of the mixed graphs: 8, 16, 32, every 64 up to 1024, every 128 up to 2048 (capped by
    `max_tokens`, which is itself captured)."""
    top = min(max_tokens, MAX_MIXED_GRAPH_TOKENS)
    sizes = [8, 16, 32, *range(64, 1024, 64), *range(1024, MAX_MIXED_GRAPH_TOKENS, 128)]
    return [s for s in sizes if s < top] + [top]


def choose_size(ladder: list[int], num_tokens: int) -> int | None:
    """The smallest captured token count that holds the step, or None to run it eagerly."""
    i = bisect.bisect_left(ladder, num_tokens)
    return ladder[i] if i < len(ladder) else None


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

    def metadata(self, num_tokens: int, num_seqs: int, max_query_len: int) -> AttentionMetadata:
        """Metadata over views of the buffers; max_query_len 1 is a decode step (the decode kernel alone)."""
        decode = max_query_len == 1
        return AttentionMetadata(
            self.cu_seqlens[:num_seqs + 1], self.context_lens[:num_seqs], self.slot_mapping[:num_tokens],
            self.block_tables[:num_seqs], self.block_size, max_query_len=max_query_len, max_context_len=self.max_len,
            num_decodes=num_seqs if decode else 0, max_decode_context_len=self.max_len if decode else 0)

    def load(self, num_tokens: int, num_seqs: int, input_ids, positions, meta: AttentionMetadata) -> None:
        """Copy a step's inputs into the buffers, padded to `num_tokens` and `num_seqs` at the end."""
        t, n = input_ids.shape[0], meta.num_seqs
        self.input_ids[:t].copy_(input_ids)
        self.positions[:t].copy_(positions)
        self.slot_mapping[:t].copy_(meta.slot_mapping)
        self.slot_mapping[t:num_tokens].fill_(-1)
        self.context_lens[:n].copy_(meta.context_lens)
        self.context_lens[n:num_seqs].zero_()
        self.cu_seqlens[:n + 1].copy_(meta.cu_seqlens_q)
        self.cu_seqlens[n + 1:num_seqs + 1].fill_(t)  # padding sequences are empty
        self.block_tables[:n, :meta.block_tables.shape[1]].copy_(meta.block_tables)


def padded_forward(model, buffers: GraphBuffers, num_tokens: int, num_seqs: int, max_query_len: int,
                   build_metadata) -> torch.Tensor:
    """The forward a graph records: final hidden states [num_tokens, hidden], padding rows included. Metadata
    is built inside so what it derives from the buffers is recomputed on every replay."""
    meta = build_metadata(buffers.metadata(num_tokens, num_seqs, max_query_len))
    return model(buffers.input_ids[:num_tokens], buffers.positions[:num_tokens], meta)


class CUDAGraphs:
    @torch.inference_mode()
    def __init__(self, model, max_batch: int, max_blocks_per_seq: int, block_size: int, device, build_metadata,
                 num_speculative_tokens: int = 0, max_mixed_tokens: int = 0, pool=None):
        self.ladders = graph_ladders(max_batch, num_speculative_tokens)
        self.mixed_ladder = token_ladder(max_mixed_tokens) if max_mixed_tokens else []
        self.max_batch = max_batch
        shapes = [(q, b) for q, ladder in self.ladders.items() for b in ladder]
        decode_tokens = max(q * b for q, b in shapes)
        self.buffers = GraphBuffers(max([decode_tokens, *self.mixed_ladder]), max_batch, max_blocks_per_seq,
                                    block_size, device)
        self.logits = torch.empty(decode_tokens, model.config.vocab_size, dtype=torch.float32, device=device)
        self.hidden = torch.empty(max(self.mixed_ladder, default=0), model.config.hidden_size,
                                  dtype=model.model.embed_tokens.weight.dtype, device=device)
        self.graphs, self.mixed, self._pool = {}, {}, pool
        # Largest first, so smaller graphs reuse the shared pool's memory.
        for size in sorted(self.mixed_ladder, reverse=True):
            self.mixed[size] = self._capture(functools.partial(self._mixed_forward, model, size, build_metadata))
        for shape in sorted(shapes, key=lambda s: s[0] * s[1], reverse=True):
            self.graphs[shape] = self._capture(functools.partial(self._forward, model, shape, build_metadata))

    def _forward(self, model, shape: tuple[int, int], build_metadata) -> None:
        query_len, batch = shape
        t = query_len * batch
        hidden = padded_forward(model, self.buffers, t, batch, query_len, build_metadata)
        self.logits[:t].copy_(model.compute_logits(hidden))

    def _mixed_forward(self, model, size: int, build_metadata) -> None:
        self.hidden[:size].copy_(padded_forward(model, self.buffers, size, self.seqs_of(size), size, build_metadata))

    def seqs_of(self, size: int) -> int:
        """The sequences a mixed graph of `size` tokens is recorded for: as many as a step of that size can hold."""
        return min(size, self.max_batch)

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
        """Logits [tokens, vocab] of a decode or verify step, by replay."""
        self.buffers.load(shape[0] * shape[1], shape[1], input_ids, positions, meta)
        self.graphs[shape].replay()
        return self.logits[:input_ids.shape[0]]

    def run_mixed(self, size: int, input_ids, positions, meta: AttentionMetadata) -> torch.Tensor:
        """Final hidden states [tokens, hidden] of a mixed step of at most `size` tokens, by replay."""
        self.buffers.load(size, self.seqs_of(size), input_ids, positions, meta)
        self.mixed[size].replay()
        return self.hidden[:input_ids.shape[0]]
