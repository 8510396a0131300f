"""Weight-only 8-bit matmul: y = x @ (W * scale).T with W stored in int8 or fp8 (e4m3), x in 16 or 32 bits.

Each program computes a [BLOCK_M, BLOCK_N] tile of y: it reads W's 8-bit tile, widens it to x's dtype in
registers (never a dequantized copy in memory) and multiplies on the tensor cores with a float32 accumulator;
the per-output-channel scales are applied once, to the tile. At a few tokens a step the time is reading W:
half the bytes of a 16-bit weight. A long K is split across programs (SPLIT_K) so that a small M still fills
the GPU; their partial sums are added in float32. One token with fp8 weights goes to `_w8_gemv_kernel`
instead, a multiply and sum on the CUDA cores with no tensor-core layout to fill: `scripts/w8_sweep.py` timed
it faster than the tiles there (and not for int8), as it timed the small-M tile sizes below.

    >>> y = w8_matmul(x, qweight, scale)   # x [M, K], qweight [N, K] int8/fp8, scale [N] float32 -> [M, N]
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _w8_matmul_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                      FP8: tl.constexpr):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :],
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_wn + ks[None, :],
                    mask=(cols[:, None] < N) & (ks[None, :] < K), other=0)
        if FP8:  # fp8 travels as its bytes (uint8): masked lanes load as 0, which is also fp8's 0
            w = w.to(tl.float8e4nv, bitcast=True)
        acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    acc *= tl.load(scale_ptr + cols, mask=cols < N, other=0.0)[None, :]
    out = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    if SPLIT_K == 1:
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(out, acc, mask=mask)


@triton.jit
def _w8_gemv_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SPLIT_K: tl.constexpr, FP8: tl.constexpr):
    """One token: y = (W * scale) @ x, each program BLOCK_N outputs, multiplied and summed along K in float32."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_wn + ks[None, :],
                    mask=(cols[:, None] < N) & (ks[None, :] < K), other=0)
        if FP8:
            w = w.to(tl.float8e4nv, bitcast=True)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1) * tl.load(scale_ptr + cols, mask=cols < N, other=0.0)
    if SPLIT_K == 1:
        tl.store(out_ptr + cols, y.to(out_ptr.dtype.element_ty), mask=cols < N)
    else:
        tl.atomic_add(out_ptr + cols, y, mask=cols < N)


def _split_k(x: torch.Tensor, tiles: int, K: int, block_k: int, per_sm: int, most: int) -> int:
    """Split K so that about `per_sm` programs per streaming multiprocessor read W (a power of 2: each value is
    a compilation)."""
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1
    split_k = max(1, min(triton.cdiv(per_sm * sms, tiles), triton.cdiv(K, block_k), most))
    return 1 << (split_k.bit_length() - 1)


def w8_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] (rows contiguous), qweight [N, K] int8 or float8_e4m3fn, scale [N] float32 -> [M, N] in x's dtype."""
    M, K = x.shape
    N = qweight.shape[0]
    assert qweight.shape[1] == K and x.stride(1) == 1 and qweight.stride(1) == 1 and scale.dtype == torch.float32
    fp8 = qweight.dtype == torch.float8_e4m3fn
    w = qweight.view(torch.uint8) if fp8 else qweight
    if M == 1 and fp8:
        block_n, block_k = 8, 512
        split_k = _split_k(x, triton.cdiv(N, block_n), K, block_k, per_sm=4, most=32)
    elif M <= 16:  # a decode step: few tiles, so K is split
        block_m, block_n, block_k, num_stages = 16, 32, 256, 4
        split_k = _split_k(x, triton.cdiv(N, block_n), K, block_k, per_sm=4, most=32)
    else:
        block_m, block_n, block_k, num_stages = 64, 128, 64, 3
        tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
        split_k = _split_k(x, tiles, K, 4 * block_k, per_sm=4, most=16)
    if split_k == 1:
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    else:
        out = torch.zeros(M, N, dtype=torch.float32, device=x.device)
    if M == 1 and fp8:
        _w8_gemv_kernel[(triton.cdiv(N, block_n), split_k)](
            x, w, scale, out, N, K, qweight.stride(0), BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, FP8=fp8,
            num_warps=4, num_stages=3)
    elif M > 0:
        _w8_matmul_kernel[(triton.cdiv(M, block_m), triton.cdiv(N, block_n), split_k)](
            x, w, scale, out, M, N, K, x.stride(0), qweight.stride(0), out.stride(0),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, FP8=fp8, num_warps=4,
            num_stages=num_stages)
    return out if split_k == 1 else out.to(x.dtype)
