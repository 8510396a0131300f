"""Rotary position embedding (RoPE) applied to q and k in place, as one Triton kernel.

One program per token loads its cos/sin row once and rotates all its query and key heads in
place; q and k may be strided views into the packed qkv projection. Same "rotate half" layout and
float32 math as `minivllm.layers.basic.RotaryEmbedding`.

    >>> q = qkv[:, :Hq * D].view(T, Hq, D)                  # a view, not contiguous
    >>> k = qkv[:, Hq * D:(Hq + Hkv) * D].view(T, Hkv, D)
    >>> apply_rotary_(positions, q, k, rotary.cos, rotary.sin)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(x_ptr, token_stride, head_stride, token, num_heads, cos, sin,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < num_heads) & (dims < HALF)
    first = x_ptr + token * token_stride + heads * head_stride + dims
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    # (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
    tl.store(first, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(first + HALF, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize_on_alignment=["pos_ptr"])  # positions may be a view at any offset
def _rotary_kernel(pos_ptr, q_ptr, k_ptr, cos_ptr, sin_ptr,
                   q_token_stride, q_head_stride, k_token_stride, k_head_stride, cos_stride,
                   num_q_heads, num_k_heads,
                   HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_ptr + pos * cos_stride + dims, mask=dims < HALF, other=0.0)
    sin = tl.load(sin_ptr + pos * cos_stride + dims, mask=dims < HALF, other=0.0)
    _rotate_heads(q_ptr, q_token_stride, q_head_stride, token, num_q_heads, cos, sin, HALF, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(k_ptr, k_token_stride, k_head_stride, token, num_k_heads, cos, sin, HALF, BLOCK_HK, BLOCK_HALF)


def apply_rotary_(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor):
    """positions [T]; q [T, Hq, D], k [T, Hkv, D] rotated in place; cos/sin [max_positions, D/2]
    float32. Returns (q, k)."""
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    assert k.shape == (T, Hkv, D) and positions.shape == (T,), "q, k and positions disagree on T or D"
    assert q.stride(2) == 1 and k.stride(2) == 1, "the head dimension of q and k must be contiguous"
    assert D % 2 == 0 and cos.shape[1] == D // 2 and cos.shape == sin.shape, "cos/sin must be [max_positions, D/2]"
    assert cos.dtype == sin.dtype == torch.float32 and cos.is_contiguous() and sin.is_contiguous()
    BLOCK_HQ, BLOCK_HK = triton.next_power_of_2(Hq), triton.next_power_of_2(Hkv)
    BLOCK_HALF = triton.next_power_of_2(D // 2)
    num_warps = min(max(BLOCK_HQ * BLOCK_HALF // 512, 1), 8)
    if T > 0:
        _rotary_kernel[(T,)](positions, q, k, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                             cos.stride(0), Hq, Hkv, HALF=D // 2, BLOCK_HQ=BLOCK_HQ, BLOCK_HK=BLOCK_HK,
                             BLOCK_HALF=BLOCK_HALF, num_warps=num_warps)
    return q, k
