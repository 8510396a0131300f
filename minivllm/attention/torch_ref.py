"""Reference attention in plain PyTorch: readable first, fast enough to test against.

One function serves prefill and decode, paged and contiguous caches, GQA and sliding
windows, because all of them are the same computation on a padded view of the flat batch:

1. pad the flat queries into `[num_seqs, max_query_len, heads, head_dim]`;
2. gather each sequence's keys/values from the cache by its block table into
   `[num_seqs, max_context_len, kv_heads, head_dim]`;
3. mask: query at absolute position p sees key j when j <= p (causal), j < context_len,
   and j > p - sliding_window (the window keeps the last `sliding_window` tokens);
4. softmax attention, then drop the padding again.

Decodes (one query each) and prefill chunks are attended as two groups, so a decode is
never padded to a chunk's length. The index tensors and the masks are the same for every
layer, so they are built once per step (`TorchAttentionMetadata.build`). The Triton kernels
(`minivllm.kernels`, notebook 10) compute the same thing without the gather.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .backend import AttentionBackend
from .metadata import AttentionMetadata, NoCacheMetadata

SDP_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write the new tokens' keys/values into their cache slots (one flat index per token)."""
    k_cache.view(-1, *k.shape[1:])[slot_mapping] = k
    v_cache.view(-1, *v.shape[1:])[slot_mapping] = v


def _pad_index(cu_seqlens: torch.Tensor, max_len: int, num_tokens: int):
    """Index of each sequence's i-th token in the flat batch, whether it exists, where the real
    tokens sit in the padded layout, and the lengths. `unpad` is computed from the token count the
    host knows, not with `nonzero()` or a boolean mask, whose output size the host would have to wait
    for the GPU to learn: the CPU then keeps running ahead of the GPU (notebook 12)."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    i = torch.arange(max_len, device=cu_seqlens.device)
    valid = i[None, :] < lens[:, None]
    index = (cu_seqlens[:-1, None] + i[None, :]).clamp(max=num_tokens - 1)
    token = torch.arange(num_tokens, device=cu_seqlens.device)
    owner = torch.searchsorted(cu_seqlens[1:].contiguous(), token.to(cu_seqlens.dtype), right=True)
    unpad = owner * max_len + token - cu_seqlens[owner]
    return index.long(), valid, unpad.long(), lens


def attention_mask(q_lens, kv_lens, num_queries, num_keys, sliding_window=None, q_valid=None):
    """[B, Lq, Lk] bool: may query i of sequence b see key j? The new queries are the last
    q_lens[b] of the kv_lens[b] tokens of sequence b."""
    device = q_lens.device
    q_pos = (kv_lens - q_lens)[:, None] + torch.arange(num_queries, device=device)[None, :]
    k_pos = torch.arange(num_keys, device=device)[None, None, :]
    mask = (k_pos <= q_pos[:, :, None]) & (k_pos < kv_lens[:, None, None])
    if sliding_window is not None:
        mask &= k_pos > q_pos[:, :, None] - sliding_window
    if q_valid is not None:
        mask |= ~q_valid[:, :, None]  # padding rows: any finite softmax will do, they are dropped
    return mask


def _expand_kv_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """GQA: each KV head serves `num_heads / kv_heads` consecutive query heads. (expand + reshape
    rather than repeat_interleave, which can wait on the GPU to learn its output size.)"""
    b, n, kv_heads, d = x.shape
    group = num_heads // kv_heads
    return x[:, :, :, None, :].expand(b, n, kv_heads, group, d).reshape(b, n, num_heads, d)


def masked_attention(q, k, v, mask, scale):
    """Softmax attention over padded tensors: q [B, Lq, Hq, D], k/v [B, Lk, Hkv, D], mask [B, Lq, Lk]."""
    # GQA on a CPU: SDPA reads each KV head for its group of query heads in place (enable_gqa). Copying
    # the KV heads out to every query head first writes Hq / Hkv times the gathered keys and values,
    # and on a CPU that copy, not the attention, was most of a decode step (4x slower per layer for
    # SmolLM2's 3 KV heads). On a GPU the expanded copy stays: the memory-efficient kernel, the one
    # that takes a mask, does not do GQA, and SDPA would fall back to its slow math path.
    gqa = q.device.type == "cpu"
    if not gqa:
        k, v = _expand_kv_heads(k, q.shape[2]), _expand_kv_heads(v, q.shape[2])
    # Not cuDNN's backend: it builds a new plan for every new shape, and during decode the
    # context grows by one token per step, so every step would pay tens of ms for a plan.
    with sdpa_kernel(SDP_BACKENDS):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask[:, None], scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2)


@dataclass
class GroupPlan:
    """How one group of sequences (the decodes, or the prefill chunks) is attended on a padded view."""
    q_index: torch.Tensor   # [B, Lq] flat index of each padded query
    unpad: torch.Tensor     # where the real queries sit in the flattened [B * Lq] output
    slots: torch.Tensor     # [B, Lk] cache slot of each key
    mask: torch.Tensor      # [B, Lq, Lk]


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    """AttentionMetadata plus the reference's index tensors and masks: the same for every layer,
    so `build` makes them once per step (the model runner calls it)."""
    groups: list[GroupPlan] = field(default_factory=list)

    @classmethod
    def build(cls, meta: AttentionMetadata, sliding_window: int | None = None) -> "TorchAttentionMetadata":
        common = {f.name: getattr(meta, f.name) for f in fields(AttentionMetadata)}
        d, groups = meta.num_decodes, []
        if d > 0:  # decodes: one query each, padded only to the longest decode context
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
                    meta: TorchAttentionMetadata, scale: float) -> torch.Tensor:
    """q: [num_tokens, Hq, D] -> [num_tokens, Hq, D], keys/values read from the cache (the sliding
    window, if any, is in the masks `TorchAttentionMetadata.build` made)."""
    outs = []
    k_slots, v_slots = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
    for g in meta.groups:
        # index_select on the flat slot list, not k_slots[g.slots]: the same gather, but on a CPU
        # advanced indexing takes about 1.7x as long for these [B, Lk] index tensors.
        k = k_slots.index_select(0, g.slots.flatten()).view(*g.slots.shape, *k_slots.shape[1:])
        v = v_slots.index_select(0, g.slots.flatten()).view(*g.slots.shape, *v_slots.shape[1:])
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
    """The readable reference: index tensors and masks built once per step, then a padded gather and SDPA."""
    name = "torch"

    def build_metadata(self, meta: AttentionMetadata) -> TorchAttentionMetadata:
        return TorchAttentionMetadata.build(meta, self.sliding_window)

    def forward(self, q, k, v, k_cache, v_cache, meta: TorchAttentionMetadata, scale: float) -> torch.Tensor:
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        return paged_attention(q, k_cache, v_cache, meta, scale)
