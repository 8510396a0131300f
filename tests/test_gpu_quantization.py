"""On the GPU: the quantized paths compiled for the device agree with the torch reference. Skipped without CUDA;
run on the GPU machine with `python -m pytest -m gpu tests/test_gpu_quantization.py`."""
import random

import pytest
import torch
import torch.nn.functional as F

from minivllm import LLM, SamplingParams
from minivllm.attention import AttentionMetadata, torch_ref
from minivllm.layers.quantization import (
    dequantize,
    fp8_scaled_mm,
    quantize_per_channel,
    quantize_per_token,
    quantized_linear,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
needs_fp8 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                               reason="FP8 needs compute capability 8.9")


def _relative_error(y, ref):
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("kind", ["int8", pytest.param("fp8", marks=needs_fp8)])
@pytest.mark.parametrize("m", [1, 5, 16, 17, 64, 300])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantized_linear_matches_the_dequantized_matmul(kind, m, dtype):
    g = torch.Generator(device="cuda").manual_seed(random.randrange(2**31))
    n, k = 384, 1536  # a K long enough for split-K at a few tokens
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=g) * 0.05
    x = torch.randn(3, m, k, device="cuda", dtype=dtype, generator=g)
    bias = torch.randn(n, device="cuda", dtype=dtype, generator=g)
    qweight, scale = quantize_per_channel(w, kind)
    ref = F.linear(x.float(), dequantize(qweight, scale, torch.float32), bias.float())
    y = quantized_linear(x, qweight, scale, bias)
    assert y.shape == (3, m, n) and y.dtype == dtype
    # W8A8 also rounds x to e4m3 (about 2^-4 relative); the weight-only paths round only the output.
    assert _relative_error(y, ref) < (0.06 if kind == "fp8" and 3 * m >= 64 else 0.01)


@needs_fp8
def test_fp8_scaled_mm_scales_each_token():
    g = torch.Generator(device="cuda").manual_seed(random.randrange(2**31))
    w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, generator=g)
    x = torch.randn(128, 512, device="cuda", dtype=torch.bfloat16, generator=g)
    x[7] *= 1000  # one loud token must not cost the others their precision
    qweight, scale = quantize_per_channel(w, "fp8")
    ref = x.float() @ dequantize(qweight, scale, torch.float32).T
    y = fp8_scaled_mm(x, qweight, scale)
    rows = [i for i in range(128) if i != 7]
    assert _relative_error(y[rows], ref[rows]) < 0.06


@needs_fp8
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_per_token_quant_fp8_writes_torchs_bytes(dtype):
    from minivllm.kernels import per_token_quant_fp8
    seed = random.randrange(2**31)
    g = torch.Generator(device="cuda").manual_seed(seed)
    # Magnitudes from 3e-4 to 1e3 of the row's own, from 1e-3 to 1 (float16's range), a row of zeros, strided rows.
    x = torch.randn(300, 3000, device="cuda", generator=g)
    x *= torch.empty_like(x).uniform_(-8, 7, generator=g).exp()
    x *= torch.empty(300, 1, device="cuda").uniform_(-7, 0, generator=g).exp()
    x[5] = 0
    x = x.to(dtype)[:, 100:2900]
    x_q, scale = per_token_quant_fp8(x)
    # The reference runs on the CPU: torch on CUDA divides by a Python number as a multiply by its reciprocal,
    # which can be an ulp off the correctly rounded amax / 448.
    ref_q, ref_scale = quantize_per_token(x.cpu())
    assert torch.equal(scale.cpu(), ref_scale), f"{seed=}"
    assert torch.equal(x_q.cpu().view(torch.uint8), ref_q.view(torch.uint8)), f"{seed=}"


@needs_fp8
@pytest.mark.parametrize("context", [1, 16, 17, 300])
def test_fp8_kv_kernels_match_the_torch_reference(context):
    from minivllm.kernels import paged_decode_attention, paged_prefill_attention, store_kv
    g = torch.Generator(device="cuda").manual_seed(random.randrange(2**31))
    hq, hkv, d, block, seqs = 8, 2, 64, 16, 3
    blocks_per_seq = -(-context // block)
    tables = torch.randperm(seqs * blocks_per_seq, device="cuda", generator=g).int().view(seqs, blocks_per_seq)
    k_cache = torch.zeros(seqs * blocks_per_seq, block, hkv, d, device="cuda", dtype=torch.float8_e4m3fn)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(seqs * context, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(seqs * context, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    pos = torch.arange(context, device="cuda")
    slots = torch.cat([tables[s, pos // block].long() * block + pos % block for s in range(seqs)])
    k_scale, v_scale = 0.5, 2.0
    store_kv(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    ref_k, ref_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    torch_ref.store_kv(k, v, ref_k, ref_v, slots, k_scale=k_scale, v_scale=v_scale)
    for cache, ref_cache in ((k_cache, ref_k), (v_cache, ref_v)):  # equal to within e4m3's rounding step
        torch.testing.assert_close(cache.float(), ref_cache.float(), rtol=0.125, atol=2 ** -9)

    lens = torch.full((seqs,), context, dtype=torch.int32, device="cuda")
    q = torch.randn(seqs * context, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = torch.arange(0, seqs * context + 1, context, dtype=torch.int32, device="cuda")
    meta = torch_ref.TorchAttentionMetadata.build(AttentionMetadata(cu, lens, slots, tables, block, context, context))
    ref = torch_ref.paged_attention(q, k_cache, v_cache, meta, d ** -0.5, k_scale=k_scale, v_scale=v_scale)
    out = paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, d ** -0.5,
                                  k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    last = cu[1:] - 1
    dec = paged_decode_attention(q[last], k_cache, v_cache, tables, lens, d ** -0.5, k_scale=k_scale,
                                 v_scale=v_scale)
    torch.testing.assert_close(dec.float(), ref[last].float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("options", [dict(quantization="int8"), pytest.param(dict(quantization="fp8"), marks=needs_fp8),
                                     pytest.param(dict(quantization="fp8", kv_cache_dtype="fp8"), marks=needs_fp8)])
def test_quantized_engines_replay_graphs_with_the_eager_tokens(tiny_llama, options):
    # Decode graphs and mixed-step graphs hold the same kernels as the eager path: same tokens. A
    # prompt longer than SCALED_MM_MIN_TOKENS sends fp8's prefill through _scaled_mm.
    g = torch.Generator().manual_seed(random.randrange(2**31))
    prompts = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (4, 19, 70)]
    tokens = {}
    for eager in (False, True):
        llm = LLM(tiny_llama[0], dtype="bfloat16", max_model_len=128, num_kv_blocks=32, max_num_seqs=4,
                  max_num_batched_tokens=128, enforce_eager=eager, **options)
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
        tokens[eager] = [o.outputs[0].token_ids for o in outs]
        assert llm.llm_engine.get_stats()["num_free_blocks"] == llm.llm_engine.get_stats()["num_total_blocks"]
        llm.shutdown()
    assert tokens[False] == tokens[True]
