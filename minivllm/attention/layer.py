"""The attention layer: holds its KV cache (`bind_cache`) and hands the forward to the backend;
a forward without a cache uses the torch reference. An fp8 cache has one scale per tensor (keys, values) and
layer: 1.0, as vLLM uses when a checkpoint brings no calibrated scales; e4m3 reaches +-448.
"""
from __future__ import annotations

import torch
from torch import nn

from . import torch_ref
from .backend import AttentionBackend
from .metadata import NoCacheMetadata


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, backend: AttentionBackend):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.backend = backend
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.k_scale = self.v_scale = 1.0

    def bind_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache

    def forward(self, q, k, v, meta) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] for this step's tokens -> [T, Hq, D]."""
        if isinstance(meta, NoCacheMetadata):
            return torch_ref.attention_without_cache(q, k, v, meta, self.scale, self.backend.sliding_window)
        return self.backend.forward(q, k, v, self.k_cache, self.v_cache, meta, self.scale, self.k_scale, self.v_scale)
