"""Piecewise CUDA graphs for mixed steps (prefill chunks with decodes): the forward between attentions replayed,
attention itself run eagerly between the pieces, as vLLM's piecewise mode does.

A decode graph (cuda_graphs.py) freezes attention's shapes: one query per sequence. A step that carries a prompt
chunk has any mix of query lengths, but attention is the only op that mixes rows: the embedding, norms, matmuls,
rotary and activation work token by token. So the forward is cut at every attention into `num_layers + 1` pieces
(embed + layer 0 up to its attention, layer i's output half + layer i + 1's input half, ..., the final norm),
each captured once per token count of `token_ladder`. A step of n tokens takes the smallest count T >= n: its
tokens are copied into fixed buffers, and for each layer the piece is replayed, then attention runs eagerly on
the n real rows with the step's own metadata and writes into the buffer the next piece reads. Rows n..T keep
an earlier step's values: they only ever touch their own rows. All pieces share one memory pool.
"""
from __future__ import annotations

import bisect
import functools
from collections.abc import Callable

import torch

# Mixed steps past this many tokens run eagerly: there the GPU's work per layer outlasts the host's launches.
MAX_PIECEWISE_TOKENS = 2048


def token_ladder(max_tokens: int) -> list[int]:
    """The token counts captured: 8, 16, 32, every 64 up to 1024, every 128 up to 2048 (capped by
    `max_tokens`, which is itself captured)."""
    top = min(max_tokens, MAX_PIECEWISE_TOKENS)
    sizes = [8, 16, 32, *range(64, 1024, 64), *range(1024, MAX_PIECEWISE_TOKENS, 128)]
    return [s for s in sizes if s < top] + [top]


def choose_size(ladder: list[int], num_tokens: int) -> int | None:
    """The smallest captured token count that holds the step, or None to run it eagerly."""
    i = bisect.bisect_left(ladder, num_tokens)
    return ladder[i] if i < len(ladder) else None


class PiecewiseGraphs:
    """The pieces of `model`'s forward (a Llama: its decoder layers split at attention), captured per token count."""

    def __init__(self, model, max_tokens: int, device, pool=None):
        llama = model.model
        self.embed, self.layers, self.norm = llama.embed_tokens, list(llama.layers), llama.norm
        attn = self.layers[0].self_attn.attn
        dtype = llama.embed_tokens.weight.dtype
        self.ladder = token_ladder(max_tokens)
        t, hidden = self.ladder[-1], model.config.hidden_size
        self.input_ids = torch.zeros(t, dtype=torch.int64, device=device)
        self.positions = torch.zeros(t, dtype=torch.int64, device=device)
        self.q = torch.zeros(t, attn.num_heads, attn.head_dim, dtype=dtype, device=device)
        self.k = torch.zeros(t, attn.num_kv_heads, attn.head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.attn_out = torch.zeros_like(self.q)
        self.residual = torch.zeros(t, hidden, dtype=dtype, device=device)
        self.hidden = torch.zeros(t, hidden, dtype=dtype, device=device)
        self.pool = pool
        self.stream = torch.cuda.Stream(device) if torch.device(device).type == "cuda" else None
        self.replays: dict[int, list[Callable[[], None]]] = {}
        with torch.inference_mode():
            for size in reversed(self.ladder):  # largest first, so smaller pieces reuse the pool's memory
                pieces = [functools.partial(self._piece, i, size) for i in range(len(self.layers) + 1)]
                for piece in pieces:  # warm-up: Triton compiles its kernels outside the capture
                    piece()
                self.replays[size] = [self._capture(piece) for piece in pieces]

    def _piece(self, i: int, n: int) -> None:
        """From attention i - 1's output (or the embedding) to attention i's inputs (or the final hidden states)."""
        if i == 0:
            x, residual = self.embed(self.input_ids[:n]), None
        else:
            x, residual = self.layers[i - 1].after_attention(self.attn_out[:n], self.residual[:n])
        if i == len(self.layers):
            self.hidden[:n].copy_(self.norm(x, residual)[0])
            return
        q, k, v, residual = self.layers[i].before_attention(self.positions[:n], x, residual)
        for buffer, value in ((self.q, q), (self.k, k), (self.v, v), (self.residual, residual)):
            buffer[:n].copy_(value)

    def _capture(self, piece: Callable[[], None]) -> Callable[[], None]:
        """`piece` recorded as a CUDA graph in the shared pool; returns its replay."""
        graph = torch.cuda.CUDAGraph()
        # The low-level calls: torch.cuda.graph() would also run the garbage collector for each of the pieces.
        torch.cuda.synchronize()
        with torch.cuda.stream(self.stream):
            graph.capture_begin(pool=self.pool)
            try:
                piece()
            finally:
                graph.capture_end()
        self.pool = graph.pool()
        return graph.replay

    def run(self, size: int, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> torch.Tensor:
        """Final hidden states [n, hidden] of a step of n <= size tokens; `meta` is the backend's metadata."""
        n = input_ids.shape[0]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        for layer, replay in zip(self.layers, self.replays[size]):
            replay()
            self.attn_out[:n].copy_(layer.self_attn.attn(self.q[:n], self.k[:n], self.v[:n], meta))
        self.replays[size][-1]()
        return self.hidden[:n]
