"""This process's place in its tensor-parallel group, and the collectives a split model needs.

A process is in at most one group, so rank and size are module state; with size 1 the collectives
do nothing. NCCL carries CUDA tensors, gloo CPU tensors and host-side values.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

_rank, _size = 0, 1
_cpu_group = None  # gloo, for host-side values


def tp_rank() -> int:
    return _rank


def tp_size() -> int:
    return _size


def cpu_group():
    return _cpu_group


def init_tensor_parallel(rank: int, world_size: int, init_method: str, device_type: str,
                         timeout_s: float = 600.0) -> None:
    """Join the group (one per process)."""
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
    """Sum x over the ranks, in place."""
    if _size > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """[..., n] on each rank -> [..., n * tp_size], rank 0's slice first."""
    if _size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def kv_heads_per_rank(num_kv_heads: int, world_size: int) -> int:
    """An equal share of the KV heads, or one replicated head when there are more ranks than heads."""
    return max(1, num_kv_heads // world_size)


def check_divisible(num_heads: int, num_kv_heads: int, world_size: int) -> None:
    """Raise unless the head counts can be split over `world_size` ranks."""
    if num_heads % world_size:
        raise ValueError(f"tensor_parallel_size={world_size} must divide the {num_heads} attention heads")
    if num_kv_heads % world_size and world_size % num_kv_heads:
        raise ValueError(f"tensor_parallel_size={world_size} and the {num_kv_heads} KV heads: one must divide "
                         "the other (each rank holds an equal share of the KV heads, or one replicated head)")
