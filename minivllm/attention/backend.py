"""The attention backend interface: `build_metadata` once per step, `forward` per layer. It applies
the sliding window in attention; the scheduler and block manager free the blocks outside it.
"""
from __future__ import annotations

import torch

from .metadata import AttentionMetadata


class AttentionBackend:
    name: str
    supports_cuda_graphs = False  # steps capturable: no host syncs, launches fixed by the batch's size

    def __init__(self, sliding_window: int | None = None):
        self.sliding_window = sliding_window

    def build_metadata(self, meta: AttentionMetadata) -> AttentionMetadata:
        """The step's metadata plus what this backend's kernels need."""
        raise NotImplementedError

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float, k_scale: float = 1.0,
                v_scale: float = 1.0) -> torch.Tensor:
        """Store k/v [T, Hkv, D] in the cache, then attend: q [T, Hq, D] -> [T, Hq, D]. An fp8 (e4m3) cache
        holds k / k_scale and v / v_scale."""
        raise NotImplementedError
