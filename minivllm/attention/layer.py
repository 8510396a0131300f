"""The attention layer: store this step's keys/values in the cache, then attend.

Each decoder layer owns one `Attention`. The model runner binds that layer's slice of the KV
cache to it once (`bind_cache`); the per-step metadata arrives with every forward call, already
built for the layer's backend (`attention.metadata_builder`). A `CustomOp`: `forward_native` is
the readable torch reference, `forward_triton` the fused kernels (same results), bound once when
the model is built.
"""
from __future__ import annotations

import torch

from ..models.custom_op import CustomOp
from . import torch_ref
from .metadata import NoCacheMetadata


class Attention(CustomOp):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, sliding_window: int | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.sliding_window = sliding_window
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def bind_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache

    def forward_native(self, q, k, v, meta) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] for this step's tokens -> [T, Hq, D]."""
        if isinstance(meta, NoCacheMetadata):  # a forward with no cache at all (recompute, profiling)
            return torch_ref.attention_without_cache(q, k, v, meta, self.scale, self.sliding_window)
        torch_ref.store_kv(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        return torch_ref.paged_attention(q, self.k_cache, self.v_cache, meta, self.scale)

    def forward_triton(self, q, k, v, meta) -> torch.Tensor:
        if isinstance(meta, NoCacheMetadata):
            return torch_ref.attention_without_cache(q, k, v, meta, self.scale, self.sliding_window)
        from . import triton_backend  # imported on first use: triton loads only when asked for
        return triton_backend.paged_attention(q, k, v, self.k_cache, self.v_cache, meta, self.scale,
                                              self.sliding_window)
