"""SwiGLU's activation, silu(gate) * up, as one Triton kernel.

Reads gate and up (side by side in [T, 2*I]) once and writes the product once, with no [T, I]
temporary for silu(gate).

    >>> h = silu_and_mul(gate_up_proj(x))   # [T, 2*I] -> [T, I]
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, in_stride, out_stride, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    gate = tl.load(gate_up_ptr + row * in_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * in_stride + I + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up  # in float32, rounded once on the store
    tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2*I] -> silu(gate_up[:, :I]) * gate_up[:, I:], [T, I]."""
    T, two_i = gate_up.shape
    assert two_i % 2 == 0, "the last dimension holds gate and up: it must be even"
    assert gate_up.stride(1) == 1, "each row of gate_up must be contiguous"
    I = two_i // 2
    out = torch.empty((T, I), dtype=gate_up.dtype, device=gate_up.device)
    # wide rows are split into blocks along a second grid axis
    BLOCK = min(triton.next_power_of_2(I), 1024)
    if T > 0:
        _silu_and_mul_kernel[(T, triton.cdiv(I, BLOCK))](gate_up, out, gate_up.stride(0), out.stride(0), I,
                                                         BLOCK=BLOCK, num_warps=max(BLOCK // 256, 1))
    return out
