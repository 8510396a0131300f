"""Attention with the Triton kernels, reading the paged cache in place: the decode kernel answers the
sequences of one query, the prefill kernel those of more, both writing into one output. Neither launch
depends on how the step's tokens are shared out among its sequences, only on how many there are.
"""
from __future__ import annotations

import torch

from ..kernels import paged_decode_attention, paged_prefill_attention, store_kv
from .backend import AttentionBackend
from .metadata import AttentionMetadata


def paged_attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                    sliding_window: int | None = None, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """q: [T, Hq, D], k/v: [T, Hkv, D] of this step's tokens -> [T, Hq, D]."""
    kv_scales = dict(k_scale=k_scale, v_scale=v_scale)
    store_kv(k, v, k_cache, v_cache, meta.slot_mapping, **kv_scales)
    out = paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale, sliding_window,
                                 cu_seqlens_q=meta.cu_seqlens_q, **kv_scales)
    if meta.max_query_len > 1:  # prompt chunks (or draft tokens to verify)
        paged_prefill_attention(q, k_cache, v_cache, meta.cu_seqlens_q, meta.context_lens, meta.block_tables, scale,
                                sliding_window, out=out, min_query_len=2, **kv_scales)
    return out


class TritonAttentionBackend(AttentionBackend):
    """The fused kernels; no host sync and launches that depend on the batch's size only, so CUDA graphs can
    capture any step."""
    name = "triton"
    supports_cuda_graphs = True

    def build_metadata(self, meta: AttentionMetadata) -> AttentionMetadata:
        return meta

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, k_scale: float = 1.0,
                v_scale: float = 1.0) -> torch.Tensor:
        return paged_attention(q, k, v, k_cache, v_cache, meta, scale, self.sliding_window, k_scale, v_scale)
