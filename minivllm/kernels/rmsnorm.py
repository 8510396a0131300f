"""RMSNorm, optionally fused with the residual add, as one Triton kernel.

Every decoder layer does `residual = x + residual; x = rmsnorm(residual)` twice. In plain
torch that is several passes over [T, H] (the add, the square-and-mean, the scaling, the
weight), each reading and writing the whole activation. This kernel reads x and residual once
and writes twice (the normed output and the new residual), in a single launch.

Same numbers as `minivllm.layers.basic.RMSNorm`: the statistics in float32, the normed row
rounded to x's dtype, then multiplied by the weight.

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
    mask = cols < H  # BLOCK is a power of two, H need not be
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
        # round the sum to the input dtype, as the torch add does, before normalizing it
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(new_res_ptr + row * new_res_stride + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x32 * x32, axis=0) / H + eps)  # masked lanes are 0: they add nothing
    normed = (x32 * rstd).to(x.dtype)  # torch rounds to x's dtype before the weight: so do we
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """x [T, H], weight [H] -> out [T, H]; with residual [T, H] -> (out, x + residual)."""
    T, H = x.shape
    assert weight.shape == (H,) and weight.is_contiguous(), "weight must be a contiguous [H] vector"
    assert x.stride(1) == 1, "each row of x must be contiguous"
    # the dtype torch's `weight * normed` would give (e.g. float32 weights on a bf16 x give float32)
    out = torch.empty((T, H), dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    has_residual = residual is not None
    if has_residual:
        assert residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(1) == 1
        new_residual = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        residual = new_residual = x  # never touched: HAS_RESIDUAL=False compiles those lines away
    BLOCK = triton.next_power_of_2(H)
    num_warps = min(max(BLOCK // 256, 1), 8)  # ~8 elements per thread, at most 8 warps
    if T > 0:
        _rms_norm_kernel[(T,)](x, residual, weight, out, new_residual,
                               x.stride(0), residual.stride(0), out.stride(0), new_residual.stride(0),
                               H, eps, HAS_RESIDUAL=has_residual, BLOCK=BLOCK, num_warps=num_warps)
    return (out, new_residual) if has_residual else out
