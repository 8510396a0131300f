"""The weight-only 8-bit matmul kernel (`w8_matmul`) against x @ (W_q * scale).T in float32.

Weights quantized by `quantize_per_channel` to int8 and fp8 (e4m3); odd shapes: one row (fp8's goes to the
GEMV kernel), rows, columns and K that are not multiples of the tiles, and a long K with few tiles, which the
wrapper splits (split-K).
"""
from __future__ import annotations

import importlib
import os
import random

import pytest
import torch

from minivllm.layers.quantization import quantize_per_channel

w8 = importlib.import_module("minivllm.kernels.w8_matmul")  # the package's `w8_matmul` is the function

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# A GPU multiplies float32 x as TF32 (tl.dot's default).
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4) if DEVICE == "cpu" else dict(atol=2e-2, rtol=2e-2),
       torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
BF16_DOT_BROKEN = os.environ.get("TRITON_INTERPRET") == "1"  # triton#11584: multiplies bf16 as raw bits


@pytest.mark.parametrize("dtype", [
    torch.float32,
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(BF16_DOT_BROKEN, reason="Triton's interpreter: bf16 dot")),
])
@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("M, N, K, split", [
    (1, 12, 2000, True),      # a decode step: one or two tiles, K split
    (1, 300, 100, False),     # one token, many output tiles: no split
    (5, 70, 200, False),      # N and K not multiples of the tiles
    (70, 130, 96, False),     # M past one 64-row tile, N and K not multiples either
])
def test_matches_dequantized_reference(monkeypatch, M, N, K, split, kind, dtype):
    seed = random.randrange(2 ** 32)
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(N, K, generator=g) * 0.05
    weight[:, 0] *= 20                                     # an outlier per row, as real weights have
    qweight, scale = quantize_per_channel(weight, kind)
    qweight, scale = qweight.to(DEVICE), scale.to(DEVICE)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEVICE)

    launches = []

    class Spy:  # records which kernel launched and its grid, whose last axis is the split-K factor
        def __init__(self, name):
            self.name, self.kernel = name, getattr(w8, name)

        def __getitem__(self, grid):
            launches.append((self.name, grid))
            return self.kernel[grid]
    for name in ("_w8_matmul_kernel", "_w8_gemv_kernel"):
        monkeypatch.setattr(w8, name, Spy(name))

    out = w8.w8_matmul(x, qweight, scale)
    assert out.shape == (M, N) and out.dtype == dtype
    [(name, grid)] = launches
    assert name == ("_w8_gemv_kernel" if M == 1 and kind == "fp8" else "_w8_matmul_kernel")
    assert (grid[-1] > 1) == split
    ref = x.float() @ (qweight.float() * scale[:, None]).T
    torch.testing.assert_close(out.float(), ref, **TOL[dtype], msg=lambda m: f"{seed=}: {m}")


def test_one_fp8_token_in_bfloat16():
    # The GEMV kernel multiplies on the CUDA cores, without tl.dot: bf16 activations are checked in the
    # interpreter too.
    g = torch.Generator().manual_seed(random.randrange(2 ** 32))
    qweight, scale = quantize_per_channel(torch.randn(37, 700, generator=g) * 0.05, "fp8")
    qweight, scale = qweight.to(DEVICE), scale.to(DEVICE)
    x = torch.randn(1, 700, generator=g).to(torch.bfloat16).to(DEVICE)
    out = w8.w8_matmul(x, qweight, scale)
    ref = x.float() @ (qweight.float() * scale[:, None]).T
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, **TOL[torch.bfloat16])
