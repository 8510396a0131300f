"""Per-token fp8 (e4m3) quantization of activations for W8A8 matmuls, as one Triton kernel.

One program per row: a first pass finds the row's absolute maximum, whose scale amax / 448 maps the row
onto [-448, 448]; a second writes x / scale in e4m3. Two reads of x, one write of its bytes, where torch
makes a pass over x (and a float32 temporary) for each of its ops. Matches `quantize_per_token` exactly.

    >>> x_q, scale = per_token_quant_fp8(x)   # x [M, K] -> e4m3 [M, K], float32 [M, 1]; x ~ x_q * scale
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .store_kv import _to_fp8_bytes


@triton.jit
def _per_token_quant_fp8_kernel(x_ptr, out_ptr, scale_ptr, x_stride, K, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row, out_row = x_ptr + row * x_stride, out_ptr + row * K
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, K, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < K, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    # div_rn: correctly rounded, as torch's amax / 448 (`/` is an approximate division on NVIDIA GPUs)
    scale = tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), 1e-12), 448.0)
    tl.store(scale_ptr + row, scale)
    for start in range(0, K, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < K)
        tl.store(out_row + cols, _to_fp8_bytes(x, scale), mask=cols < K)


def per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (16- or 32-bit float) -> (x_q [M, K] float8_e4m3fn, scale [M, 1] float32), x ~ x_q * scale."""
    M, K = x.shape
    assert x.stride(1) == 1, "each row of x must be contiguous"
    x_q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    BLOCK = min(triton.next_power_of_2(K), 1024)
    if M > 0:  # numpy, under the interpreter, has no fp8: the kernel writes the bytes
        _per_token_quant_fp8_kernel[(M,)](x, x_q.view(torch.uint8), scale, x.stride(0), K,
                                          BLOCK=BLOCK, num_warps=max(BLOCK // 256, 1))
    return x_q, scale
