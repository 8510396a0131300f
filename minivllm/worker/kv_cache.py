"""The KV cache tensors and how many of them fit.

Every layer gets two tensors, keys and values, of shape
`[num_blocks, block_size, num_kv_heads, head_dim]`. GQA is why `num_kv_heads` (not the
number of query heads) sizes them: Mistral-7B stores 8 heads per token, not 32.

    >>> kv_bytes_per_token(cfg, torch.bfloat16)   # Mistral-7B: 2 * 32 * 8 * 128 * 2 = 131072

A rank of a tensor-parallel group holds only the KV heads of its query heads: both functions
count this process's share (`kv_heads_per_rank`), the whole model outside a group.
"""
from __future__ import annotations

import torch

from ..config import ModelConfig
from ..distributed.parallel_state import kv_heads_per_rank, tp_size

CPU_KV_CACHE_BYTES = 2 * 2**30  # a CPU has no "free memory" query worth trusting: a fixed budget


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    return 2 * cfg.num_layers * kv_heads_per_rank(cfg.num_kv_heads, tp_size()) * cfg.head_dim * dtype.itemsize


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype, device):
    """One (keys, values) pair per layer; zero-filled so unused slots never hold NaNs."""
    shape = (num_blocks, block_size, kv_heads_per_rank(cfg.num_kv_heads, tp_size()), cfg.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_layers)]


def kv_cache_budget_bytes(device, gpu_memory_utilization: float, gpu_memory_limit_bytes: int | None = None) -> int:
    """Bytes the KV cache may take: on a GPU, the share of its memory the user granted, minus
    what the weights and a profiling forward already took (the caller runs that forward first).
    With `gpu_memory_limit_bytes` the GPU is taken to have that much memory, all of it this engine's."""
    if torch.device(device).type != "cuda":
        return CPU_KV_CACHE_BYTES
    free, total = torch.cuda.mem_get_info(device)
    peak = torch.cuda.max_memory_allocated(device)
    if gpu_memory_limit_bytes is not None:
        return int(min(total, gpu_memory_limit_bytes) * gpu_memory_utilization - peak)
    used_by_others = total - free - torch.cuda.memory_reserved(device)
    return int(total * gpu_memory_utilization - used_by_others - peak)
