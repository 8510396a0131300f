"""The paged KV-cache kernels with an fp8 (e4m3) cache and a per-tensor scale.

store_kv must write exactly torch's (x / scale).clamp(-448, 448).to(e4m3), and each attention kernel
on an fp8 cache must match the same kernel on the dequantized cache (stored * scale, in q's dtype).
Fresh random inputs each run (the seed is in the failure message); small shapes, for the interpreter.
"""
from __future__ import annotations

import random

import pytest
import torch

from minivllm.kernels.decode_attention import paged_decode_attention
from minivllm.kernels.prefill_attention import paged_prefill_attention
from minivllm.kernels.store_kv import store_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def to_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The cache's contents for x, computed by torch on the CPU."""
    return (x.cpu().float() / scale).clamp(-448, 448).to(FP8)


def dequantize(cache: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    return (cache.float() * scale).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k_scale, v_scale", [(1.0, 1.0), (0.037, 2.9)])
def test_store_kv_writes_torchs_e4m3(dtype, k_scale, v_scale):
    seed = random.randrange(2 ** 32)
    g = torch.Generator().manual_seed(seed)
    T, Hkv, D, block_size, num_blocks = 11, 3, 40, 4, 5
    # Magnitudes from 3e-4 to 1e3: e4m3's subnormals, normals and saturation, at either scale.
    kv = torch.randn(T, 2 * Hkv + 1, D, generator=g) * torch.empty(T, 2 * Hkv + 1, D).uniform_(-8, 7, generator=g).exp()
    kv = kv.to(dtype).to(DEVICE)
    k, v = kv[:, :Hkv], kv[:, Hkv:2 * Hkv]                        # strided views, as the projection gives them
    slots = torch.randperm(num_blocks * block_size, generator=g)[:T]
    slots[[2, 7]] = -1                                              # padding tokens store nothing
    # Random bytes that are not NaN (0x7f, 0xff), so untouched slots can be compared.
    k_cache, v_cache = (torch.randint(0, 127, (num_blocks, block_size, Hkv, D), generator=g, dtype=torch.uint8)
                        .view(FP8) for _ in range(2))
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    real = slots >= 0
    expect_k.view(-1, Hkv, D)[slots[real]] = to_fp8(k[real.to(DEVICE)], k_scale)
    expect_v.view(-1, Hkv, D)[slots[real]] = to_fp8(v[real.to(DEVICE)], v_scale)

    k_cache, v_cache = k_cache.to(DEVICE), v_cache.to(DEVICE)
    store_kv(k, v, k_cache, v_cache, slots.to(DEVICE), k_scale=k_scale, v_scale=v_scale)
    for got, expect, name in ((k_cache, expect_k, "k"), (v_cache, expect_v, "v")):
        bad = got.cpu().view(torch.uint8) != expect.view(torch.uint8)   # bytes: -0 and NaN compared too
        assert not bad.any(), f"{seed=}: {bad.sum()} {name} bytes differ, first at {bad.nonzero()[0].tolist()}"


def make_cache(context_lens, block_size, num_kv_heads, head_dim, k_scale, v_scale, g):
    """An fp8 paged cache of random keys and values (about N(0, 2) before scaling) and a shuffled block table."""
    max_blocks = -(-max(context_lens) // block_size) + 1
    num_blocks = len(context_lens) * max_blocks + 2
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = to_fp8(2 * torch.randn(shape, generator=g), k_scale).to(DEVICE)
    v_cache = to_fp8(2 * torch.randn(shape, generator=g), v_scale).to(DEVICE)
    tables = torch.randperm(num_blocks, generator=g)[:len(context_lens) * max_blocks].view(len(context_lens), -1)
    return k_cache, v_cache, tables.int().to(DEVICE)


# Blocks of 5 (contexts on and past a block boundary), GQA 6 query heads on 2 KV heads, a window.
# bf16 scales of few significant bits keep stored * scale exact in bf16: the interpreter truncates
# float32 -> bf16 where torch (and a GPU) round, so an inexact product would differ by an ulp.
CASES = [
    (torch.float32, 1.0, 1.0, None),
    (torch.float32, 0.021, 0.047, 7),
    (torch.bfloat16, 3 / 64, 5 / 32, None),
    (torch.bfloat16, 1.0, 1.0, 7),
]


@pytest.mark.parametrize("dtype, k_scale, v_scale, window", CASES)
def test_decode_reads_fp8_cache(dtype, k_scale, v_scale, window):
    seed = random.randrange(2 ** 32)
    g = torch.Generator().manual_seed(seed)
    block_size, num_heads, num_kv_heads, head_dim = 5, 6, 2, 32
    context_lens = [1, 5, 6, 17, 0, 23]                              # one token, on and past a boundary, padding
    k_cache, v_cache, tables = make_cache(context_lens, block_size, num_kv_heads, head_dim, k_scale, v_scale, g)
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=g).to(dtype).to(DEVICE)
    lens = torch.tensor(context_lens, dtype=torch.int32, device=DEVICE)
    args = (tables, lens, head_dim ** -0.5, window)
    out = paged_decode_attention(q, k_cache, v_cache, *args, k_scale=k_scale, v_scale=v_scale)
    ref = paged_decode_attention(q, dequantize(k_cache, k_scale, dtype), dequantize(v_cache, v_scale, dtype), *args)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref, **TOL[dtype], msg=lambda m: f"{seed=}: {m}")


@pytest.mark.parametrize("dtype, k_scale, v_scale, window", CASES)
def test_prefill_reads_fp8_cache(dtype, k_scale, v_scale, window):
    seed = random.randrange(2 ** 32)
    g = torch.Generator().manual_seed(seed)
    block_size, num_heads, num_kv_heads, head_dim = 5, 6, 2, 32
    q_lens, earlier = [1, 7, 19], [0, 9, 4]                          # chunks after earlier context
    context_lens = [e + n for e, n in zip(earlier, q_lens)]
    k_cache, v_cache, tables = make_cache(context_lens, block_size, num_kv_heads, head_dim, k_scale, v_scale, g)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=g).to(dtype).to(DEVICE)
    cu_seqlens = torch.tensor([0] + q_lens, device=DEVICE).cumsum(0).int()
    lens = torch.tensor(context_lens, dtype=torch.int32, device=DEVICE)
    args = (cu_seqlens, lens, tables, head_dim ** -0.5, window)
    out = paged_prefill_attention(q, k_cache, v_cache, *args, k_scale=k_scale, v_scale=v_scale)
    ref = paged_prefill_attention(q, dequantize(k_cache, k_scale, dtype), dequantize(v_cache, v_scale, dtype), *args)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref, **TOL[dtype], msg=lambda m: f"{seed=}: {m}")
