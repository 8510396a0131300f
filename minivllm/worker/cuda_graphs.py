"""CUDA graphs for decode and verify steps: one launch replays a whole forward instead of ~2,000.

A batch-1 decode step of a 7B model is a few ms of GPU work wrapped in tens of ms of Python
and kernel launches (notebook 11 profiles it). A CUDA graph records every kernel of one
forward once, with arguments that point at fixed buffers; replaying it is a single launch.
Shapes are frozen at capture, hence the rules here:

- a graph has a shape (query_len, batch): `batch` sequences of at most `query_len` new tokens each.
  Decode graphs have query_len 1; with speculative decoding (k guesses) verify graphs have
  query_len k + 1, a sequence's last token and its guesses. A step runs on the graph of the smallest
  query_len that holds its longest sequence, and of the next batch size up the ladder
  (1, 2, 4, 8, 16, 32, ...): `choose_graph`;
- a step's inputs are copied into the graph's buffers (`GraphBuffers.load`), then the graph is
  replayed. The real tokens come first, packed as in an eager step; the padding is at the end:
  padding tokens have cache slot -1 (not stored), padding sequences no tokens and context length 0,
  which the Triton kernels skip. So a verify step whose sequences bring fewer than k + 1 tokens
  (fewer guesses, plain decodes) needs no padding inside a sequence: the prefill kernel reads each
  sequence's own query length from cu_seqlens, and only the grid is sized for k + 1. (In a verify
  graph every sequence goes to the prefill kernel, plain decodes too: how many of them are decodes
  changes from step to step, and a graph cannot split its batch where they end.)
- the graph computes the logits of every row; the step keeps those of its first rows (in a verify
  step every token samples: its rows are in the order the rejection sampler reads them), or picks
  the sampling rows (`sample_index`) when some do not sample (a draft model's catch-up);
- verify graphs stop at the batch whose k + 1 tokens per sequence fill the decode graphs of the
  default 256 sequences (`graph_ladders`), so their activations and logits take no more memory than
  those (all graphs share one memory pool and one logits buffer); a larger verify step runs eagerly;
- only with a backend that `supports_cuda_graphs`: the Triton one (the torch reference sizes its
  tensors from the step's longest context).

    >>> graphs = CUDAGraphs(model, max_batch=256, max_blocks_per_seq=64, block_size=16, device="cuda",
    ...                     build_metadata=model.attn_backend.build_metadata, num_speculative_tokens=4)
    >>> shape = choose_graph(graphs.ladders, num_seqs=3, max_query_len=5)    # (5, 4): a verify graph
    >>> logits = graphs.run(shape, input_ids, positions, meta)    # [tokens of the step, vocab]
"""
from __future__ import annotations

import functools

import torch

from ..attention import AttentionMetadata


def batch_size_ladder(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 16: padding wastes at most 15 rows of a large batch."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sizes + [max_batch]


# Verify graphs hold at most this many tokens (or `max_batch`, if more): as many as the decode graphs of the
# default max_num_seqs, so that they add no more activations and logits than those already take.
MAX_VERIFY_GRAPH_TOKENS = 256


def graph_ladders(max_batch: int, num_speculative_tokens: int = 0) -> dict[int, list[int]]:
    """The batch sizes captured for each query length: decodes up to `max_batch`; verifies of k + 1 tokens
    per sequence up to `max_batch` too, or fewer, so that they hold no more tokens than
    max(`max_batch`, MAX_VERIFY_GRAPH_TOKENS) (at least batch 1)."""
    ladders = {1: batch_size_ladder(max_batch)}
    if num_speculative_tokens:
        q = num_speculative_tokens + 1
        ladders[q] = batch_size_ladder(min(max_batch, max(1, max(max_batch, MAX_VERIFY_GRAPH_TOKENS) // q)))
    return ladders


def choose_graph(ladders: dict[int, list[int]], num_seqs: int, max_query_len: int) -> tuple[int, int] | None:
    """(query_len, batch) of the graph that runs a step of `num_seqs` sequences of at most `max_query_len` new
    tokens each: the smallest query length that holds them, the next batch size up; None: run it eagerly."""
    for q in sorted(ladders):
        if max_query_len <= q:
            ladder = ladders[q]
            return (q, next(b for b in ladder if b >= num_seqs)) if num_seqs <= ladder[-1] else None
    return None


class GraphBuffers:
    """The fixed input buffers every graph reads, sized for the largest shape; a step is copied into them."""

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
        """The metadata of a graph of this shape: views of the buffers, the longest context a sequence can
        have, and decodes (query_len 1) sent to the decode kernel, everything else to the prefill kernel."""
        decode = query_len == 1
        return AttentionMetadata(
            self.cu_seqlens[:batch + 1], self.context_lens[:batch], self.slot_mapping[:batch * query_len],
            self.block_tables[:batch], self.block_size, max_query_len=query_len, max_context_len=self.max_len,
            num_decodes=batch if decode else 0, max_decode_context_len=self.max_len if decode else 0)

    def load(self, shape: tuple[int, int], input_ids, positions, meta: AttentionMetadata) -> None:
        """A step's inputs into the buffers, padded to `shape` at the end (slot -1, empty sequences)."""
        query_len, batch = shape
        t, n = input_ids.shape[0], meta.num_seqs
        self.input_ids[:t].copy_(input_ids)
        self.positions[:t].copy_(positions)
        self.slot_mapping[:t].copy_(meta.slot_mapping)
        self.slot_mapping[t:batch * query_len].fill_(-1)
        self.context_lens[:n].copy_(meta.context_lens)
        self.context_lens[n:batch].zero_()
        self.cu_seqlens[:n + 1].copy_(meta.cu_seqlens_q)
        self.cu_seqlens[n + 1:batch + 1].fill_(t)  # padding sequences own no tokens
        self.block_tables[:n, :meta.block_tables.shape[1]].copy_(meta.block_tables)


def padded_forward(model, buffers: GraphBuffers, shape: tuple[int, int], build_metadata) -> torch.Tensor:
    """What a graph of `shape` records: the forward of every row of the buffers, padding included, and the
    logits [query_len * batch, vocab] (the padding rows' are garbage, never read). The backend's metadata is
    built inside it, so that what it derives from the buffers (the prefill kernel's offsets) is recomputed
    at every replay."""
    query_len, batch = shape
    t = query_len * batch
    hidden = model(buffers.input_ids[:t], buffers.positions[:t], build_metadata(buffers.metadata(query_len, batch)))
    return model.compute_logits(hidden)


class CUDAGraphs:
    @torch.inference_mode()
    def __init__(self, model, max_batch: int, max_blocks_per_seq: int, block_size: int, device, build_metadata,
                 num_speculative_tokens: int = 0):
        self.ladders = graph_ladders(max_batch, num_speculative_tokens)
        shapes = [(q, b) for q, ladder in self.ladders.items() for b in ladder]
        max_tokens = max(q * b for q, b in shapes)
        self.buffers = GraphBuffers(max_tokens, max_batch, max_blocks_per_seq, block_size, device)
        # One logits buffer for every graph (each writes its first rows), not one per shape.
        self.logits = torch.empty(max_tokens, model.config.vocab_size, dtype=torch.float32, device=device)
        self.graphs, self._pool = {}, None
        # Largest first, all in one memory pool: a smaller graph reuses the larger one's memory.
        for shape in sorted(shapes, key=lambda s: s[0] * s[1], reverse=True):
            self.graphs[shape] = self._capture(functools.partial(self._forward, model, shape, build_metadata))

    def _forward(self, model, shape: tuple[int, int], build_metadata) -> None:
        self.logits[:shape[0] * shape[1]].copy_(padded_forward(model, self.buffers, shape, build_metadata))

    def _capture(self, forward) -> torch.cuda.CUDAGraph:
        """`forward` recorded as a graph, in the pool every graph shares."""
        forward()  # outside the capture: Triton compiles its kernels for these shapes now
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            forward()
        self._pool = graph.pool()
        return graph

    def run(self, shape: tuple[int, int], input_ids, positions, meta: AttentionMetadata) -> torch.Tensor:
        """Logits [tokens, vocab] of every token of a step that `choose_graph` gave `shape`, by replay."""
        self.buffers.load(shape, input_ids, positions, meta)
        self.graphs[shape].replay()
        return self.logits[:input_ids.shape[0]]
