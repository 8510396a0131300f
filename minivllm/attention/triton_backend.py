"""Attention with the Triton kernels: decodes (first in the batch) to the split-K decode kernel,
prefill chunks to the prefill kernel, both reading the paged cache in place.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..kernels import paged_decode_attention, paged_prefill_attention, store_kv
from .backend import AttentionBackend
from .metadata import AttentionMetadata


@dataclass
class TritonAttentionMetadata(AttentionMetadata):
    """AttentionMetadata plus the prefill chunks' query offsets, counted from the first chunk token."""
    prefill_cu_seqlens: torch.Tensor | None = None

    @classmethod
    def build(cls, meta: AttentionMetadata) -> "TritonAttentionMetadata":
        common = {f.name: getattr(meta, f.name) for f in fields(AttentionMetadata)}
        d = meta.num_decodes
        return cls(**common, prefill_cu_seqlens=meta.cu_seqlens_q[d:] - d if d < meta.num_seqs else None)


def paged_attention(q, k, v, k_cache, v_cache, meta: TritonAttentionMetadata, scale: float,
                    sliding_window: int | None = None, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """q: [T, Hq, D], k/v: [T, Hkv, D] of this step's tokens -> [T, Hq, D]."""
    kv_scales = dict(k_scale=k_scale, v_scale=v_scale)
    store_kv(k, v, k_cache, v_cache, meta.slot_mapping, **kv_scales)
    d = meta.num_decodes
    if d == meta.num_seqs:  # decode-only step (what decode graphs capture)
        return paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale,
                                      sliding_window, **kv_scales)
    prefill = paged_prefill_attention(q[d:], k_cache, v_cache, meta.prefill_cu_seqlens, meta.context_lens[d:],
                                      meta.block_tables[d:], meta.max_query_len, scale, sliding_window, **kv_scales)
    if d == 0:  # also verify graphs: every sequence goes to the prefill kernel
        return prefill
    decode = paged_decode_attention(q[:d], k_cache, v_cache, meta.block_tables[:d], meta.context_lens[:d],
                                    scale, sliding_window, **kv_scales)
    return torch.cat([decode, prefill])


class TritonAttentionBackend(AttentionBackend):
    """The fused kernels; no host sync, so CUDA graphs can capture decode and verify steps."""
    name = "triton"
    supports_cuda_graphs = True

    def build_metadata(self, meta: AttentionMetadata) -> TritonAttentionMetadata:
        return TritonAttentionMetadata.build(meta)

    def forward(self, q, k, v, k_cache, v_cache, meta: TritonAttentionMetadata, scale: float, k_scale: float = 1.0,
                v_scale: float = 1.0) -> torch.Tensor:
        return paged_attention(q, k, v, k_cache, v_cache, meta, scale, self.sliding_window, k_scale, v_scale)
