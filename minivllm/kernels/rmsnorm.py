"""RMSNorm, optionally fused with the residual add, as one Triton kernel.

One program per row reads x and residual once and writes the normed row and the new residual,
where torch makes several passes. Same numbers as `minivllm.layers.basic.RMSNorm`.

    >>> out = rms_norm(x, norm.weight, norm.eps)                         # x [T, H]
    >>> out, residual = rms_norm(x, norm.weight, norm.eps, residual)     # add + norm
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr,
                     x_stride, res_stride, out_stride, new_res_stride,
                     H, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
        # rounded to the input dtype, as the torch add does
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(new_res_ptr + row * new_res_stride + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x32 * x32, axis=0) / H + eps)
    normed = (x32 * rstd).to(x.dtype)  # torch rounds to x's dtype before the weight
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """x [T, H], weight [H] -> out [T, H]; with residual [T, H] -> (out, x + residual)."""
    T, H = x.shape
    assert weight.shape == (H,) and weight.is_contiguous(), "weight must be a contiguous [H] vector"
    assert x.stride(1) == 1, "each row of x must be contiguous"
    # the dtype torch's `weight * normed` would give
    out = torch.empty((T, H), dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    has_residual = residual is not None
    if has_residual:
        assert residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(1) == 1
        new_residual = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        residual = new_residual = x  # unused when HAS_RESIDUAL=False
    BLOCK = triton.next_power_of_2(H)
    num_warps = min(max(BLOCK // 256, 1), 8)  # ~8 elements per thread, at most 8 warps
    if T > 0:
        _rms_norm_kernel[(T,)](x, residual, weight, out, new_residual,
                               x.stride(0), residual.stride(0), out.stride(0), new_residual.stride(0),
                               H, eps, HAS_RESIDUAL=has_residual, BLOCK=BLOCK, num_warps=num_warps)
    return (out, new_residual) if has_residual else out
