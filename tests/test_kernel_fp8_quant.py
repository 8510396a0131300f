"""The per-token fp8 quantization kernel of the W8A8 path.

per_token_quant_fp8 must write exactly the bytes and scales of `quantize_per_token`, torch's
(x / (amax / 448)).clamp(-448, 448).to(e4m3) per row. Fresh random inputs each run (the seed is in
the failure message); small shapes, for the interpreter.
"""
from __future__ import annotations

import random

import pytest
import torch

from minivllm.kernels.fp8_quant import per_token_quant_fp8
from minivllm.layers.quantization import quantize_per_token

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def check(x: torch.Tensor, seed: int) -> None:
    x_q, scale = per_token_quant_fp8(x)
    ref_q, ref_scale = quantize_per_token(x.cpu())
    assert x_q.dtype == torch.float8_e4m3fn and x_q.shape == x.shape and x_q.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == (x.shape[0], 1)
    assert torch.equal(scale.cpu(), ref_scale), f"{seed=}: scales differ"
    bad = x_q.cpu().view(torch.uint8) != ref_q.view(torch.uint8)    # bytes: -0 and NaN compared too
    assert not bad.any(), f"{seed=}: {bad.sum()} bytes differ, first at {bad.nonzero()[0].tolist()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M, K", [(1, 64), (5, 2500)])              # 2500: three 1024-wide blocks, the last partial
def test_matches_torchs_per_token_quantization(dtype, M, K):
    seed = random.randrange(2 ** 32)
    g = torch.Generator().manual_seed(seed)
    # Each row's own magnitude, from 1e-30 to 1e30 (float16: 1e-3 to 1, below its 65504), and spread within
    # the row from 3e-4 to 1e3 of it: e4m3's subnormals, normals and the row's maximum, at scales far from 1.
    low, high = (-7, 0) if dtype == torch.float16 else (-69, 69)
    rows = torch.empty(M, 1).uniform_(low, high, generator=g).exp()
    x = torch.randn(M, K, generator=g) * torch.empty(M, K).uniform_(-8, 7, generator=g).exp() * rows
    check(x.to(dtype).to(DEVICE), seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_rows_and_strided_rows(dtype):
    seed = random.randrange(2 ** 32)
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(4, 1500, generator=g).to(dtype).to(DEVICE)
    wide[2] = 0                                                      # scale 1e-12 / 448, bytes all 0
    wide[3, ::2] = -0.0                                              # zeros keep their sign: 0x80
    wide[3, 1::2] = 0
    x = wide[:, 100:1300]                                            # a column slice: row stride 1500, K 1200
    assert x.stride() == (1500, 1)
    check(x, seed)


def test_no_rows():
    x_q, scale = per_token_quant_fp8(torch.empty(0, 64, device=DEVICE))
    assert x_q.shape == (0, 64) and x_q.dtype == torch.float8_e4m3fn
    assert scale.shape == (0, 1) and scale.dtype == torch.float32
