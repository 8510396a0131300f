"""The claims of notebooks 00 and 01, checked without running the notebooks.

- the back-of-envelope numbers their text states;
- the small inline versions of each block that the notebooks build (RMSNorm, RoPE, GQA attention,
  SwiGLU, the decoder layer, the per-token timing of HF generate) equal the package's code and
  transformers'. The inline functions are read from the notebooks themselves (only their `def`/`class`
  statements), so a notebook edit that breaks them fails here too.
"""
from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minivllm.attention import NoCacheMetadata, torch_ref
from minivllm.layers.basic import RMSNorm, RotaryEmbedding
from minivllm.models.loader import build_model, resolve_model
from minivllm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minivllm_lab import constants
from minivllm_lab.bench import roofline
from minivllm_lab.bench.metrics import summarize
from minivllm_lab.bench.serve_stats import READING_SPEED_SLO

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def notebook_definitions(name: str, **namespace) -> dict:
    """Execute only the function and class definitions of a notebook's code cells."""
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    namespace = {"torch": torch, "F": F, "np": np, "time": time, **namespace}
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if source.lstrip().startswith(("%", "!")) or "%pip" in source:
            continue
        tree = ast.parse(source)
        defs = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
        exec(compile(ast.Module(body=defs, type_ignores=[]), name, "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def nb01():
    return notebook_definitions("01_model_from_scratch.ipynb")


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    folder, hf_model = tiny_llama
    source = resolve_model(folder)
    return source.config, build_model(source.config, "cpu", torch.float32, 256, source.folder), hf_model


# ---- notebook 00: the arithmetic of the opening --------------------------------------------

def test_reading_speed_and_the_1000_customers():
    reading_tok_s = constants.reading_tok_s()  # 240 words a minute at 4/3 tokens per word
    assert reading_tok_s == pytest.approx(5.33, abs=0.01)
    assert 1 / reading_tok_s == pytest.approx(READING_SPEED_SLO["tpot_s"], abs=0.005)  # the serving SLO agrees
    customers, rate = constants.POST_CUSTOMERS, constants.POST_HF_TOK_S
    assert (customers, rate) == (1000, 17.5)
    assert customers * 150 / rate / 3600 == pytest.approx(2.38, abs=0.01)  # hours for the last customer
    assert customers * reading_tok_s / rate == pytest.approx(305, abs=1)   # "300 times too low"


def test_batch1_roofline_with_the_recorded_h200_rates():
    # roofline's recorded H200 rates: a batch-1 decode limit near 290 tok/s (14.5 GB at 4.28 TB/s)
    limit = roofline.roofline_tok_s(roofline.MISTRAL_7B, 1, 200, roofline.H200_BANDWIDTH_BPS,
                                    roofline.H200_MATMUL_FLOPS)
    assert 280 < limit < 300


# ---- notebook 01: the arithmetic of the opening --------------------------------------------

def test_mistral_bytes_and_flops():
    shape = roofline.MISTRAL_7B
    assert roofline.num_params(shape) / 1e9 == pytest.approx(7.24, abs=0.01)
    assert roofline.weight_bytes(shape) / 1e9 == pytest.approx(14.5, abs=0.05)
    read_ms = roofline.weight_bytes(shape) / roofline.H200_BANDWIDTH_BPS * 1e3
    math_ms = roofline.flops_per_token(shape, 0) / roofline.H200_MATMUL_FLOPS * 1e3
    assert read_ms == pytest.approx(3.38, abs=0.01)
    assert 180 < read_ms / math_ms < 200  # "up to ~190 tokens cost about the same as one"


# ---- notebook 01: the inline blocks equal the package's -----------------------------------

def test_inline_rms_norm(nb01):
    x, w = torch.randn(5, 64), torch.randn(64)
    norm = RMSNorm(64, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(w)
        torch.testing.assert_close(nb01["rms_norm"](x, w, 1e-5), norm(x))


def test_inline_rope(nb01):
    positions = torch.tensor([0, 1, 2, 7, 100, 3])
    q, k = torch.randn(6, 4, 16), torch.randn(6, 2, 16)
    q_ref, k_ref = RotaryEmbedding(16, 256, 10000.0)(positions, q, k)
    torch.testing.assert_close(nb01["rope"](q, positions), q_ref)
    torch.testing.assert_close(nb01["rope"](k, positions), k_ref)


def test_inline_attention_on_a_flat_batch(nb01):
    lens = [5, 1, 9]
    cu = torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32)
    q, k, v = torch.randn(sum(lens), 8, 16), torch.randn(sum(lens), 2, 16), torch.randn(sum(lens), 2, 16)
    flat = torch_ref.attention_without_cache(q, k, v, NoCacheMetadata(cu, max(lens)), 16**-0.5)
    bounds = zip(cu[:-1].tolist(), cu[1:].tolist())
    expected = torch.cat([nb01["naive_attention"](q[a:b], k[a:b], v[a:b]) for a, b in bounds])
    torch.testing.assert_close(flat, expected)


def test_inline_swiglu_and_decoder_layer(nb01, tiny):
    cfg, model, hf_model = tiny
    layer, hf_mlp = model.model.layers[0], hf_model.model.layers[0].mlp
    x = torch.randn(7, cfg.hidden_size)
    positions = torch.arange(7)
    meta = NoCacheMetadata(torch.tensor([0, 7], dtype=torch.int32), 7)
    with torch.no_grad():
        torch.testing.assert_close(
            nb01["swiglu"](x, hf_mlp.gate_proj.weight, hf_mlp.up_proj.weight, hf_mlp.down_proj.weight), layer.mlp(x))
        out, residual = layer(positions, x, None, meta)
        torch.testing.assert_close(nb01["decoder_layer"](layer, x, positions, meta), out + residual)


# ---- notebook 00: timing HF generate token by token ---------------------------------------

def test_timed_generate_matches_the_baseline(tiny):
    from minivllm_lab.baselines import hf_generate_sequential
    _, _, hf_model = tiny
    nb00 = notebook_definitions("00_baseline_and_metrics.ipynb", constants=constants, RequestOutput=RequestOutput,
                                RequestMetrics=RequestMetrics, CompletionOutput=CompletionOutput)
    prompt = [5, 17, 42, 99, 3]
    out, times = nb00["timed_generate"](hf_model, prompt, 6)
    assert out.outputs[0].token_ids == hf_generate_sequential(hf_model, [prompt], 6)[0]
    assert len(times) == 6 and times == sorted(times)
    m = out.metrics
    stats = summarize([out])
    assert stats["ttft_p50_s"] == pytest.approx(m.first_token_time - m.arrival_time)
    assert stats["tpot_p50_s"] == pytest.approx(np.diff(times).mean())
    assert stats["e2e_p50_s"] == pytest.approx(times[-1] - m.arrival_time)
