"""The KV cache tensors and how many blocks fit.

Each layer has a key and a value tensor of shape `[num_blocks, block_size, num_kv_heads, head_dim]`,
where `num_kv_heads` is this rank's share of the KV heads.
"""
from __future__ import annotations

import torch

from ..config import ModelConfig
from ..distributed.parallel_state import kv_heads_per_rank, tp_size

CPU_KV_CACHE_BYTES = 2 * 2**30


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    return 2 * cfg.num_layers * kv_heads_per_rank(cfg.num_kv_heads, tp_size()) * cfg.head_dim * dtype.itemsize


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype, device):
    """One (keys, values) pair per layer, zero-filled so unused slots hold no NaNs."""
    shape = (num_blocks, block_size, kv_heads_per_rank(cfg.num_kv_heads, tp_size()), cfg.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_layers)]


def kv_cache_budget_bytes(device, gpu_memory_utilization: float, gpu_memory_limit_bytes: int | None = None) -> int:
    """Bytes for the KV cache: the granted share of GPU memory minus the peak use so far (the caller
    runs a profiling forward first). `gpu_memory_limit_bytes` overrides the GPU's total memory."""
    if torch.device(device).type != "cuda":
        return CPU_KV_CACHE_BYTES
    free, total = torch.cuda.mem_get_info(device)
    peak = torch.cuda.max_memory_allocated(device)
    if gpu_memory_limit_bytes is not None:
        return int(min(total, gpu_memory_limit_bytes) * gpu_memory_utilization - peak)
    used_by_others = total - free - torch.cuda.memory_reserved(device)
    return int(total * gpu_memory_utilization - used_by_others - peak)
