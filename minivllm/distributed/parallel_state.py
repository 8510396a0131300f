"""Who am I in the tensor-parallel group, and the two collectives a split model needs.

Tensor parallelism (Megatron-LM's scheme, as vLLM, SGLang and nano-vllm use it) runs ONE model
over N processes, one per GPU: every weight matrix is cut into N slices, each process multiplies
by its slice, and the partial results meet in a collective:

- `all_reduce`: every rank holds a partial sum of the same tensor; afterwards each holds the sum
  (after the row-parallel `o_proj` and `down_proj`, and the vocabulary-parallel embedding);
- `all_gather`: every rank holds a slice of the logits' vocabulary; afterwards each holds all of it.

A process belongs to at most one group, so its place in it is module state, read by the layers
when they are built and by the collectives when they run (`tp_rank()`, `tp_size()`): a model built
outside any group is the plain, unsplit model, with both collectives doing nothing. (So one process
holds one tensor-parallel engine at a time: the engine refuses to start another beside it.) NCCL
carries the tensors between GPUs, gloo between CPU processes; a gloo group of the same ranks also
serves host-side values (the KV pool's size, agreed by all).
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

_rank, _size = 0, 1
_cpu_group = None  # gloo group of the same ranks, for host-side values


def tp_rank() -> int:
    return _rank


def tp_size() -> int:
    return _size


def cpu_group():
    return _cpu_group


def init_tensor_parallel(rank: int, world_size: int, init_method: str, device_type: str,
                         timeout_s: float = 600.0) -> None:
    """Join the group: NCCL for CUDA tensors, gloo for CPU ones (and a gloo group for host values)."""
    global _rank, _size, _cpu_group
    if dist.is_initialized():
        raise RuntimeError("a torch.distributed process group already exists in this process: "
                           "one tensor-parallel engine per process")
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank,
                            timeout=timedelta(seconds=timeout_s))
    _cpu_group = dist.new_group(backend="gloo") if backend == "nccl" else dist.group.WORLD
    _rank, _size = rank, world_size


def destroy_tensor_parallel() -> None:
    global _rank, _size, _cpu_group
    if dist.is_initialized():
        dist.destroy_process_group()
    _rank, _size, _cpu_group = 0, 1, None


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum x over the ranks, in place (one call per row-parallel layer)."""
    if _size > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """[..., n] on each rank -> [..., n * tp_size] on every rank, rank 0's slice first."""
    if _size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def kv_heads_per_rank(num_kv_heads: int, world_size: int) -> int:
    """KV heads each rank holds: an equal share, or one replicated head when there are more ranks
    than KV heads (GQA: 8 KV heads over 16 ranks means 2 ranks hold each head)."""
    return max(1, num_kv_heads // world_size)


def check_divisible(num_heads: int, num_kv_heads: int, world_size: int) -> None:
    """The head counts a split needs, with the reason in the error."""
    if num_heads % world_size:
        raise ValueError(f"tensor_parallel_size={world_size} must divide the {num_heads} attention heads")
    if num_kv_heads % world_size and world_size % num_kv_heads:
        raise ValueError(f"tensor_parallel_size={world_size} and the {num_kv_heads} KV heads: one must divide "
                         "the other (each rank holds an equal share of the KV heads, or one replicated head)")
