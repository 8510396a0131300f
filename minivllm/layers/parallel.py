"""Tensor-parallel layers (Megatron-LM's scheme): `ColumnParallelLinear` (qkv_proj, gate_up_proj)
splits output rows with no communication, `RowParallelLinear` (o_proj, down_proj) splits input
columns and all-reduces the partial sums, so a decoder layer needs two all-reduces. The vocabulary
is split by rows, padded when the rank count does not divide it. With one rank these are the plain
layers. `weight_loader` copies this rank's slice of a checkpoint tensor. A quantized weight (quantization.py)
is 8-bit with a `weight_scale` per output row.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.parallel_state import all_gather_last_dim, all_reduce, tp_rank, tp_size
from .quantization import quantized_linear


def init_like_nn_linear(weight: nn.Parameter, bias: nn.Parameter | None) -> None:
    """Random weights as `nn.Linear` draws them (dummy weights)."""
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        bound = 1 / math.sqrt(weight.shape[1])
        nn.init.uniform_(bias, -bound, bound)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, weight_scale: torch.Tensor | None):
    """x @ W.T + bias, W either in the activations' dtype or quantized (8-bit, one scale per output row)."""
    if weight_scale is None:
        return F.linear(x, weight, bias)
    return quantized_linear(x, weight, weight_scale, bias)


class ColumnParallelLinear(nn.Module):
    """y = x @ W.T for this rank's output rows. `shards` packs several checkpoint tensors (q, k, v or
    gate, up): for each, (its rows, the first this rank holds, how many)."""

    def __init__(self, input_size: int, shards: list[tuple[int, int, int]], bias: bool = False):
        super().__init__()
        self.input_size = input_size
        self.shards = shards
        self.output_sizes = [rows for _, _, rows in shards]
        self.weight = nn.Parameter(torch.empty(sum(self.output_sizes), input_size))
        self.bias = nn.Parameter(torch.empty(sum(self.output_sizes))) if bias else None
        self.register_buffer("weight_scale", None)
        init_like_nn_linear(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.weight_scale)

    def checkpoint_shape(self, param: torch.Tensor, shard_id: int) -> tuple[int, ...]:
        full_rows = self.shards[shard_id][0]
        return (full_rows, self.input_size) if param.dim() == 2 else (full_rows,)

    def weight_loader(self, param: torch.Tensor, checkpoint_slice, shard_id: int) -> None:
        _, start, rows = self.shards[shard_id]
        offset = sum(self.output_sizes[:shard_id])
        param.narrow(0, offset, rows).copy_(checkpoint_slice[start:start + rows])


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x_r @ W_r.T: this rank holds the input columns of its slice of x."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.input_size_per_rank = input_size // tp_size()
        self.weight = nn.Parameter(torch.empty(output_size, self.input_size_per_rank))
        self.bias = nn.Parameter(torch.empty(output_size)) if bias else None
        self.register_buffer("weight_scale", None)
        init_like_nn_linear(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The bias is added once, by rank 0.
        return all_reduce(linear(x, self.weight, self.bias if tp_rank() == 0 else None, self.weight_scale))

    def checkpoint_shape(self, param: torch.Tensor, shard_id=None) -> tuple[int, ...]:
        return (self.output_size, self.input_size) if param.dim() == 2 else (self.output_size,)

    def weight_loader(self, param: torch.Tensor, checkpoint_slice, shard_id=None) -> None:
        if param.dim() == 1:  # the bias is whole on every rank
            param.copy_(checkpoint_slice[:])
            return
        start = tp_rank() * self.input_size_per_rank
        param.copy_(checkpoint_slice[:, start:start + self.input_size_per_rank])


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + rows_per_rank) of the (padded) vocabulary live on this rank."""

    def __init__(self, vocab_size: int, hidden_size: int, init_weights: bool = True):
        super().__init__()
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.rows_per_rank = -(-vocab_size // tp_size())
        self.start = tp_rank() * self.rows_per_rank
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, hidden_size))
        if init_weights:
            nn.init.normal_(self.weight)  # as nn.Embedding

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if tp_size() == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        mine = (local >= 0) & (local < self.rows_per_rank)
        out = F.embedding(torch.where(mine, local, 0), self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return all_reduce(out)

    def checkpoint_shape(self, param: torch.Tensor, shard_id=None) -> tuple[int, ...]:
        return (self.vocab_size, self.hidden_size)

    def weight_loader(self, param: torch.Tensor, checkpoint_slice, shard_id=None) -> None:
        rows = max(0, min(self.rows_per_rank, self.vocab_size - self.start))
        param.zero_()  # padding rows
        if rows:
            param[:rows].copy_(checkpoint_slice[self.start:self.start + rows])


class ParallelLMHead(VocabParallelEmbedding):
    """Logits for this rank's vocabulary rows, all-gathered."""

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__(vocab_size, hidden_size, init_weights=False)
        init_like_nn_linear(self.weight, None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = all_gather_last_dim(F.linear(hidden, self.weight))
        return logits[..., :self.vocab_size]
