"""Reference attention in plain PyTorch: pad the flat batch, gather each sequence's keys and values
through its block table, mask (causal, sliding window), attend with SDPA, unpad. Decodes and
prefill chunks are padded as two groups.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .backend import AttentionBackend
from .metadata import AttentionMetadata, NoCacheMetadata

SDP_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def to_cache(x: torch.Tensor, cache_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """x as the cache stores it: an fp8 (e4m3) cache holds x / scale, saturated at +-448."""
    if cache_dtype != torch.float8_e4m3fn:
        return x.to(cache_dtype)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(cache_dtype)


def from_cache(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    if x.dtype != torch.float8_e4m3fn:
        return x
    return (x.float() * scale).to(dtype)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write the new tokens' keys/values into their cache slots (one flat index per token)."""
    k_cache.view(-1, *k.shape[1:])[slot_mapping] = to_cache(k, k_cache.dtype, k_scale)
    v_cache.view(-1, *v.shape[1:])[slot_mapping] = to_cache(v, v_cache.dtype, v_scale)


def _pad_index(cu_seqlens: torch.Tensor, max_len: int, num_tokens: int):
    """(index, valid, unpad, lens) of the padded layout. No `nonzero()`, which would sync the host."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    i = torch.arange(max_len, device=cu_seqlens.device)
    valid = i[None, :] < lens[:, None]
    index = (cu_seqlens[:-1, None] + i[None, :]).clamp(max=num_tokens - 1)
    token = torch.arange(num_tokens, device=cu_seqlens.device)
    owner = torch.searchsorted(cu_seqlens[1:].contiguous(), token.to(cu_seqlens.dtype), right=True)
    unpad = owner * max_len + token - cu_seqlens[owner]
    return index.long(), valid, unpad.long(), lens


def attention_mask(q_lens, kv_lens, num_queries, num_keys, sliding_window=None, q_valid=None):
    """[B, Lq, Lk] bool: may query i of sequence b (its last q_lens[b] of kv_lens[b] tokens) see key j?"""
    device = q_lens.device
    q_pos = (kv_lens - q_lens)[:, None] + torch.arange(num_queries, device=device)[None, :]
    k_pos = torch.arange(num_keys, device=device)[None, None, :]
    mask = (k_pos <= q_pos[:, :, None]) & (k_pos < kv_lens[:, None, None])
    if sliding_window is not None:
        mask &= k_pos > q_pos[:, :, None] - sliding_window
    if q_valid is not None:
        mask |= ~q_valid[:, :, None]  # padding rows: dropped later, need only a finite softmax
    return mask


def _expand_kv_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """GQA: each KV head serves `num_heads / kv_heads` consecutive query heads."""
    b, n, kv_heads, d = x.shape
    group = num_heads // kv_heads
    return x[:, :, :, None, :].expand(b, n, kv_heads, group, d).reshape(b, n, num_heads, d)


def masked_attention(q, k, v, mask, scale):
    """Softmax attention over padded tensors: q [B, Lq, Hq, D], k/v [B, Lk, Hkv, D], mask [B, Lq, Lk]."""
    # On a GPU, SDPA's kernel that takes a mask does not do GQA: expand the KV heads there.
    gqa = q.device.type == "cpu"
    if not gqa:
        k, v = _expand_kv_heads(k, q.shape[2]), _expand_kv_heads(v, q.shape[2])
    # Not cuDNN's backend: it builds a plan for every new shape, and decode's context grows each step.
    with sdpa_kernel(SDP_BACKENDS):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask[:, None], scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2)


@dataclass
class GroupPlan:
    """The padded view of one group of sequences (the decodes, or the prefill chunks)."""
    q_index: torch.Tensor   # [B, Lq]
    unpad: torch.Tensor     # real queries in the flattened [B * Lq] output
    slots: torch.Tensor     # [B, Lk]
    mask: torch.Tensor      # [B, Lq, Lk]


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    """AttentionMetadata plus the reference's index tensors and masks, built once per step."""
    groups: list[GroupPlan] = field(default_factory=list)

    @classmethod
    def build(cls, meta: AttentionMetadata, sliding_window: int | None = None) -> "TorchAttentionMetadata":
        common = {f.name: getattr(meta, f.name) for f in fields(AttentionMetadata)}
        d, groups = meta.num_decodes, []
        if d > 0:  # decodes: padded only to the longest decode context
            groups.append(_group_plan(meta, slice(0, d), 0, d, 1, meta.max_decode_context_len, sliding_window))
        if d < meta.num_seqs:
            groups.append(_group_plan(meta, slice(d, meta.num_seqs), d, meta.num_tokens - d, meta.max_query_len,
                                      meta.max_context_len, sliding_window))
        return cls(**common, groups=groups)


def _group_plan(meta: AttentionMetadata, seqs: slice, first_token: int, num_tokens: int,
                max_query_len: int, max_context_len: int, sliding_window) -> GroupPlan:
    cu_seqlens = meta.cu_seqlens_q[seqs.start:seqs.stop + 1] - first_token
    context_lens = meta.context_lens[seqs]
    q_index, q_valid, unpad, q_lens = _pad_index(cu_seqlens, max_query_len, num_tokens)
    j = torch.arange(max_context_len, device=q_index.device)
    blocks = meta.block_tables[seqs].long()[:, j // meta.block_size]
    slots = blocks * meta.block_size + j % meta.block_size          # [B, Lk]
    mask = attention_mask(q_lens, context_lens, max_query_len, max_context_len, sliding_window, q_valid)
    return GroupPlan(q_index + first_token, unpad, slots, mask)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: TorchAttentionMetadata, scale: float, k_scale: float = 1.0,
                    v_scale: float = 1.0) -> torch.Tensor:
    """q: [num_tokens, Hq, D] -> [num_tokens, Hq, D], keys and values read from the cache."""
    outs = []
    k_slots, v_slots = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
    for g in meta.groups:
        # index_select: the same gather as k_slots[g.slots], faster on a CPU.
        k = k_slots.index_select(0, g.slots.flatten()).view(*g.slots.shape, *k_slots.shape[1:])
        v = v_slots.index_select(0, g.slots.flatten()).view(*g.slots.shape, *v_slots.shape[1:])
        k, v = from_cache(k, q.dtype, k_scale), from_cache(v, q.dtype, v_scale)
        outs.append(masked_attention(q[g.q_index], k, v, g.mask, scale).flatten(0, 1)[g.unpad])
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def attention_without_cache(q, k, v, meta: NoCacheMetadata, scale: float,
                            sliding_window: int | None = None) -> torch.Tensor:
    """Each sequence attends causally over its own tokens in this batch (no KV cache)."""
    L = meta.max_query_len
    mask = attention_mask(meta.lens, meta.lens, L, L, sliding_window, meta.valid)
    index = meta.padded_index
    return masked_attention(q[index], k[index], v[index], mask, scale).flatten(0, 1)[meta.unpad]


class TorchAttentionBackend(AttentionBackend):
    """The readable reference: a padded gather and SDPA."""
    name = "torch"

    def build_metadata(self, meta: AttentionMetadata) -> TorchAttentionMetadata:
        return TorchAttentionMetadata.build(meta, self.sliding_window)

    def forward(self, q, k, v, k_cache, v_cache, meta: TorchAttentionMetadata, scale: float, k_scale: float = 1.0,
                v_scale: float = 1.0) -> torch.Tensor:
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        return paged_attention(q, k_cache, v_cache, meta, scale, k_scale, v_scale)
