"""Writes the step's new keys and values into their paged-cache slots, as one Triton kernel.

One program per token copies its key and value from the (strided) projection into the cache.
A negative slot is padding (CUDA graphs replay a padded batch) and stores nothing.
The cache may be fp8 (e4m3) with one scale per tensor (vLLM's uncalibrated default is 1.0): it then
holds x / scale, saturated at +-448, and the attention kernels read stored * scale.

    >>> store_kv(k, v, k_cache, v_cache, slot_mapping)   # k/v [T, Hkv, D], caches [blocks, block_size, Hkv, D]
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _round_to_e4m3(x):
    """x (float32) rounded to the nearest e4m3 value, ties to even, still as float32. The cast to
    tl.float8e4nv of the result is then exact: Triton's interpreter rounds that cast wrongly itself."""
    bits = x.to(tl.uint32, bitcast=True)
    sign = bits & 0x80000000
    mag = bits ^ sign
    # Normal (|x| >= 2^-6): keep 3 of the 23 mantissa bits, rounding to nearest even; a carry moves the exponent.
    normal = (mag + 0x7FFFF + ((mag >> 20) & 1)) & 0xFFF00000
    # Subnormal: steps of 2^-9, the ulp of float32 values in [2^14, 2^15), so adding 1.5 * 2^14 rounds.
    subnormal = ((tl.abs(x) + 24576.0) - 24576.0).to(tl.uint32, bitcast=True)
    return (tl.where(mag < 0x3C800000, subnormal, normal) | sign).to(tl.float32, bitcast=True)  # 0x3C800000: 2^-6


@triton.jit
def _to_fp8_bytes(x, scale):
    """x / scale as e4m3, saturated, returned as its bytes (fp8 caches travel as uint8)."""
    # div_rn: correctly rounded, as torch's x / scale; `/` compiles to an approximate division on NVIDIA GPUs.
    x = tl.math.div_rn(x.to(tl.float32), scale)
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)  # e4m3's largest finite value: saturate, not NaN
    return _round_to_e4m3(x).to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     k_token_stride, k_head_stride, v_token_stride, v_head_stride,
                     num_heads, k_scale, v_scale,
                     HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, FP8: tl.constexpr):
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
    if FP8:
        k, v = _to_fp8_bytes(k, k_scale), _to_fp8_bytes(v, v_scale)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """k, v [T, Hkv, D] -> k_cache, v_cache [num_blocks, block_size, Hkv, D] at flat slots
    slot_mapping [T] (block * block_size + offset); tokens with a negative slot are skipped.
    An fp8 (e4m3) cache stores k / k_scale and v / v_scale; other caches ignore the scales."""
    T, Hkv, D = k.shape
    assert v.shape == k.shape and slot_mapping.shape == (T,), "k, v and slot_mapping disagree"
    assert k.stride(2) == 1 and v.stride(2) == 1, "the head dimension of k and v must be contiguous"
    assert k_cache.shape == v_cache.shape and k_cache.dtype == v_cache.dtype and k_cache.shape[2:] == (Hkv, D), \
        "caches must be [blocks, block_size, Hkv, D], of one dtype"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "the kernel indexes the caches by flat slot"
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8:  # numpy, under the interpreter, has no fp8: the kernel takes the bytes
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    BLOCK_H, BLOCK_D = triton.next_power_of_2(Hkv), triton.next_power_of_2(D)
    num_warps = min(max(BLOCK_H * BLOCK_D // 1024, 1), 8)
    if T > 0:
        _store_kv_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0),
                               v.stride(1), Hkv, k_scale, v_scale, HEAD_DIM=D, BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D,
                               FP8=fp8, num_warps=num_warps)
