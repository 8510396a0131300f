"""Writes the step's new keys and values into their paged-cache slots, as one Triton kernel.

One program per token copies its key and value from the (strided) projection into the cache.
A negative slot is padding (CUDA graphs replay a padded batch) and stores nothing.

    >>> store_kv(k, v, k_cache, v_cache, slot_mapping)   # k/v [T, Hkv, D], caches [blocks, block_size, Hkv, D]
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     k_token_stride, k_head_stride, v_token_stride, v_head_stride,
                     num_heads, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    # int64: slot * Hkv * D can pass 2**31
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # padding token
        return
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_heads) & (dims < HEAD_DIM)
    dst = slot * num_heads * HEAD_DIM + heads * HEAD_DIM + dims
    k = tl.load(k_ptr + token * k_token_stride + heads * k_head_stride + dims, mask=mask)
    v = tl.load(v_ptr + token * v_token_stride + heads * v_head_stride + dims, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v [T, Hkv, D] -> k_cache, v_cache [num_blocks, block_size, Hkv, D] at flat slots
    slot_mapping [T] (block * block_size + offset); tokens with a negative slot are skipped."""
    T, Hkv, D = k.shape
    assert v.shape == k.shape and slot_mapping.shape == (T,), "k, v and slot_mapping disagree"
    assert k.stride(2) == 1 and v.stride(2) == 1, "the head dimension of k and v must be contiguous"
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (Hkv, D), \
        "caches must be [blocks, block_size, Hkv, D]"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "the kernel indexes the caches by flat slot"
    BLOCK_H, BLOCK_D = triton.next_power_of_2(Hkv), triton.next_power_of_2(D)
    num_warps = min(max(BLOCK_H * BLOCK_D // 1024, 1), 8)
    if T > 0:
        _store_kv_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0),
                               v.stride(1), Hkv, HEAD_DIM=D, BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D, num_warps=num_warps)
