"""What 8-bit weights and an 8-bit KV cache buy on a GPU, in one run and one JSON (notebook 17's numbers).

- batch-1 decode, unquantized / int8 / fp8 / fp8 + fp8 KV, against the limit set by the bytes a step reads;
- W2 and W3-offline, unquantized against fp8 + fp8 KV, each engine sized by its own memory;
- KV blocks at equal memory (`kv_cache_memory_bytes`), 16-bit against fp8;
- the linear layers of one decoder layer at 1 to 4096 tokens a step: the 16-bit matmul, the weight-only
  kernel (int8, fp8) and W8A8 `_scaled_mm`, as time (replays of a CUDA graph, as in the engine's decode
  step) and share of the bandwidth; decode attention over a 16-bit and an fp8 cache.

    python -m minivllm_lab.bench.quantization --out figures/17_quantization.json   # Mistral-7B's shape, bf16
    python -m minivllm_lab.bench.quantization --t4 --out t4.json      # a T4's budget: Llama-3.2-1B, fp16, int8
    python -m minivllm_lab.bench.quantization --smoke                 # a tiny model, seconds, any machine
    python -m minivllm_lab.bench.quantization --kernels --out k.json  # the linear layers and decode attention only

On an H200 the first command also runs the second in a child process and keeps its result under "t4_profile".
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

from minivllm import LLM
from minivllm.layers.quantization import fp8_scaled_mm, quantize_per_channel
from minivllm.models.loader import resolve_model
from minivllm.utils import plural

from ..machine import T4_CAPABILITY, T4_MEMORY_GIB, free_memory, tiny_checkpoint
from . import roofline, runners
from .kernels import _paged_cache, _time_ms
from .metrics import hardware_name, median, save_json, source_commit
from .profile import decode_step_times_ms
from .workloads import w2, w3_offline

CONFIGS = {"unquantized": {}, "int8": {"quantization": "int8"}, "fp8": {"quantization": "fp8"},
           "fp8 + fp8 KV": {"quantization": "fp8", "kv_cache_dtype": "fp8"}}
TOKENS = (1, 16, 64, 256, 1024, 4096)
KV_MEMORY = 4 * 2**30  # the batch-1 engines' pool: room enough, and the same bytes for every configuration
# Bytes of weight copies a linear-layer timing cycles through: past the L2 cache of any GPU (an H200 has 60 MB
# of it). At most MAX_COPIES copies: a tiny model's layer would need thousands.
L2_BEATING_BYTES, MAX_COPIES = 256 * 2**20, 32


def has_fp8() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def weight_bytes_read(shape: roofline.ModelShape, weight_bytes: float, dtype_bytes: int) -> float:
    """Bytes of weights one decode step reads: the layers' projections at `weight_bytes` a weight (plus a
    float32 scale per output channel when quantized), the lm_head in the model's dtype."""
    linears = linear_shapes(shape).values()
    layers = shape.num_layers * sum(n * k for n, k in linears) * weight_bytes
    if weight_bytes < dtype_bytes:
        layers += shape.num_layers * sum(4 * n for n, _ in linears)
    return layers + shape.vocab_size * shape.hidden_size * dtype_bytes


def batch1_decode(model: str, engine_args: dict, configs: dict, bandwidth: float | None, steps: int) -> dict:
    """Batch-1 decode tok/s of each configuration, its limit (bandwidth / bytes read a step) and the KV blocks
    its pool of KV_MEMORY bytes holds."""
    shape = roofline.ModelShape.from_config(resolve_model(model).config)
    dtype_bytes = torch.empty(0, dtype=getattr(torch, engine_args["dtype"])).element_size()
    out = {}
    for name, options in configs.items():
        llm = LLM(model, **engine_args, **options, max_model_len=512, max_num_seqs=4, max_num_batched_tokens=512,
                  kv_cache_memory_bytes=KV_MEMORY)
        try:
            ms = median(decode_step_times_ms(llm, batch=1, context=128, steps=steps))
            row = {"ms_per_token": ms, "tok_s": 1e3 / ms,
                   "num_kv_blocks": llm.llm_engine.get_stats()["num_total_blocks"]}
        finally:
            del llm
            free_memory()
        bytes_read = weight_bytes_read(shape, 1 if "quantization" in options else dtype_bytes, dtype_bytes)
        row["weight_bytes_read"] = bytes_read
        if bandwidth:
            row["limit_tok_s"] = bandwidth / bytes_read
            row["fraction_of_limit"] = row["tok_s"] / row["limit_tok_s"]
        out[name] = row
        print(f"batch-1 decode, {name}: {row['tok_s']:.1f} tok/s" +
              (f" ({100 * row['fraction_of_limit']:.0f}% of {row['limit_tok_s']:.0f})" if bandwidth else ""))
    return out


def offline(model: str, engine_args: dict, configs: dict, works: list) -> dict:
    """Output tok/s of each workload under each configuration, one engine per configuration sized by its
    memory (quantized weights leave more room for the KV cache)."""
    out = {}
    max_model_len = max(len(p) + n for w in works for p, n in zip(w.prompts, w.max_tokens))
    for name, options in configs.items():
        llm = LLM(model, **engine_args, **options, max_model_len=max_model_len)
        try:
            blocks = llm.llm_engine.get_stats()["num_total_blocks"]
            for w in works:
                row = runners.run_minivllm(llm, w, engine=name)
                out.setdefault(w.name, {})[name] = {"output_tok_s": row["output_tok_s"], "wall_s": row["wall_s"],
                                                    "num_preemptions": row["num_preemptions"],
                                                    "num_kv_blocks": blocks}
                print(f"{w.name}, {name}: {row['output_tok_s']:,.0f} tok/s ({blocks} KV blocks)")
        finally:
            del llm
            free_memory()
    return out


def linear_shapes(shape: roofline.ModelShape) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear layer of one decoder layer, as minivllm packs them."""
    h, ffn = shape.hidden_size, shape.intermediate_size
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return {"qkv_proj": (q + 2 * kv, h), "o_proj": (h, q), "gate_up_proj": (2 * ffn, h), "down_proj": (h, ffn)}


def graph_ms(call, copies: list) -> float:
    """Median GPU ms of `call` on one copy of the weights, from replays of a CUDA graph that calls it on every
    copy in turn (triton's do_bench_cudagraph): the GPU's time without the host's launches, and each call reads
    its weights from memory, not from the L2 cache."""
    from triton.testing import do_bench_cudagraph
    return do_bench_cudagraph(lambda: [call(c) for c in copies], rep=25, return_mode="median") / len(copies)


def linear_kernels(shape: roofline.ModelShape, dtype: torch.dtype, bandwidth: float | None, tokens, kinds) -> dict:
    """Time of one decoder layer's four linears at each number of tokens, per path, and the share of the
    bandwidth the weight reads reach (bytes of the weights, the activations in and out, the scales). Timed on a
    GPU as replays of a CUDA graph, as the engine runs a decode step: launched one by one from Python, the
    linears of a few tokens would time the host's launches more than the kernels."""
    from minivllm.kernels import w8_matmul
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = linear_shapes(shape)
    weights = {name: torch.randn(n, k, device="cuda", dtype=dtype, generator=g) * 0.02
               for name, (n, k) in shapes.items()}
    # Copies of the layer's weights that together outgrow the L2 cache even in 8 bits, read in turn.
    num_copies = min(MAX_COPIES, max(2, -(-L2_BEATING_BYTES // sum(n * k for n, k in shapes.values()))))
    wide = [weights] + [{name: w.clone() for name, w in weights.items()} for _ in range(num_copies - 1)]
    quantized = {kind: [{name: quantize_per_channel(w, kind) for name, w in copy.items()} for copy in wide]
                 for kind in kinds}
    out = {}
    for m in tokens:
        xs = {name: torch.randn(m, w.shape[1], device="cuda", dtype=dtype, generator=g) for name, w in weights.items()}
        paths = {"16-bit matmul": (lambda ws: [F.linear(xs[n], w) for n, w in ws.items()], wide, dtype.itemsize)}
        for kind in kinds:
            paths[f"{kind} weight-only kernel"] = (
                lambda qs: [w8_matmul(xs[n], *q) for n, q in qs.items()], quantized[kind], 1)
        if "fp8" in kinds:
            paths["fp8 W8A8 _scaled_mm"] = (
                lambda qs: [fp8_scaled_mm(xs[n], *q) for n, q in qs.items()], quantized["fp8"], 1)
        row = {}
        for path, (call, copies, wbytes) in paths.items():
            ms = graph_ms(call, copies)
            nbytes = sum(n * k * wbytes + m * (n + k) * dtype.itemsize + (4 * n if wbytes == 1 else 0)
                         for n, k in shapes.values())
            row[path] = {"ms": ms, "GB_s": nbytes / ms / 1e6}
            if bandwidth:
                row[path]["fraction_of_bandwidth"] = nbytes / (ms / 1e3) / bandwidth
        out[str(m)] = row
        print(f"{plural(m, 'token'):>12}: " + ", ".join(f"{p} {r['ms'] * 1e3:.0f} us" for p, r in row.items()))
    return out


def decode_attention_kernel(shape: roofline.ModelShape, dtype: torch.dtype, bandwidth: float | None, fp8: bool,
                            batch: int = 32, context: int = 4096) -> dict:
    """Decode attention over `batch` sequences of `context` tokens, 16-bit cache against fp8: time and share of
    the bandwidth (the cache's bytes)."""
    from minivllm.kernels import paged_decode_attention
    hq, hkv, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
    k_cache, v_cache, tables = _paged_cache(batch, context, hkv, d, 16, dtype, "cuda")
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, hq, d, dtype=dtype, device="cuda")
    caches = {f"{dtype}".replace("torch.", ""): (k_cache, v_cache)}
    if fp8:
        caches["fp8 e4m3"] = (k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn))
    out = {"batch": batch, "context": context}
    for name, (k, v) in caches.items():
        ms = _time_ms(lambda: paged_decode_attention(q, k, v, tables, lens, d ** -0.5), on_gpu=True)
        nbytes = 2 * batch * context * hkv * d * k.element_size()
        out[name] = {"ms": ms, "GB_s": nbytes / ms / 1e6}
        if bandwidth:
            out[name]["fraction_of_bandwidth"] = nbytes / (ms / 1e3) / bandwidth
        print(f"decode attention {batch} x {context}, {name} cache: {ms * 1e3:.0f} us")
    return out


def t4_profile(out_path: str) -> dict:
    """This module under a T4's budget in a child process (its memory cap and kernel settings stay there)."""
    subprocess.run([sys.executable, "-m", "minivllm_lab.bench.quantization", "--t4", "--out", out_path], check=True)
    with open(out_path) as f:
        return json.load(f)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench-results/17_quantization.json")
    parser.add_argument("--t4", action="store_true", help="a T4's budget: 15 GiB, fp16, T4 kernels, Llama-3.2-1B")
    parser.add_argument("--smoke", action="store_true", help="a tiny model and workloads, any machine")
    parser.add_argument("--kernels", action="store_true", help="only the linear layers and decode attention (a GPU)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if args.kernels and not cuda:
        raise SystemExit("--kernels times the GPU's kernels: it needs one")
    if args.t4:
        if not cuda:
            raise SystemExit("--t4 reproduces a T4 on a larger GPU: it needs one")
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, T4_MEMORY_GIB * 2**30 / total))
        os.environ["MINIVLLM_KERNEL_CAPABILITY"] = ".".join(map(str, T4_CAPABILITY))
    if args.smoke or not cuda:
        os.environ["MINIVLLM_SMOKE"] = "1"
        model, dtype = tiny_checkpoint(), torch.float32 if not cuda else torch.float16
    else:
        model, dtype = ("llama-3.2-1b", torch.float16) if args.t4 else ("mistral-7b", torch.bfloat16)
    fp8 = has_fp8() and not args.t4
    engine_args = {"dtype": str(dtype).replace("torch.", ""), "load_format": "dummy" if cuda else "auto"}
    if not cuda:
        engine_args["num_kv_blocks"] = 64
    shape = roofline.ModelShape.from_config(resolve_model(model).config)
    bandwidth = roofline.measure_bandwidth_Bps() if cuda else None
    configs = {k: v for k, v in CONFIGS.items() if fp8 or "fp8" not in k}
    result = {"hardware": f"{hardware_name()}, {model}, {engine_args['dtype']}, random weights"
              + (" (T4 profile: 15 GiB cap, T4 kernel settings)" if args.t4 else ""),
              "commit": source_commit(),
              "command": "python -m minivllm_lab.bench.quantization" + (" --t4" if args.t4 else "")
              + (" --smoke" if args.smoke else "") + (" --kernels" if args.kernels else ""),
              "bandwidth_GB_s": bandwidth / 1e9 if bandwidth else None}
    if not cuda:  # the KV pool is sized by num_kv_blocks on a CPU: only the tok/s are measured
        result["batch1_decode"] = {}
        for name, options in configs.items():
            llm = LLM(model, **engine_args, **options, max_model_len=256)
            result["batch1_decode"][name] = {"tok_s": 1e3 / median(decode_step_times_ms(llm, 1, 16, steps=3))}
            del llm
        save_json(args.out, result)
        return result
    if not args.kernels:
        result["batch1_decode"] = batch1_decode(model, engine_args, configs, bandwidth,
                                                steps=10 if args.smoke else 100)
        save_json(args.out, result)  # each part as it comes: a run cut short keeps what it measured
    if not args.t4 and not args.kernels:
        kv = {name: row["num_kv_blocks"] for name, row in result["batch1_decode"].items()}
        result["kv_blocks_at_equal_memory"] = {"kv_cache_memory_bytes": KV_MEMORY, **kv}
        small = dict(num_requests=8) if args.smoke else {}
        works = [w2(shape.vocab_size, **small), w3_offline(shape.vocab_size, **small)]
        result["offline"] = offline(model, engine_args, {k: configs[k] for k in ("unquantized", "fp8 + fp8 KV")
                                                         if k in configs}, works)
        save_json(args.out, result)
    kinds = ("int8", "fp8") if fp8 else ("int8",)
    result["linear_kernels"] = linear_kernels(shape, dtype, bandwidth, TOKENS[:3] if args.smoke else TOKENS, kinds)
    result["decode_attention_kernel"] = decode_attention_kernel(shape, dtype, bandwidth, fp8)
    save_json(args.out, result)
    if not (args.t4 or args.smoke or args.kernels):
        with tempfile.TemporaryDirectory() as tmp:
            result["t4_profile"] = t4_profile(os.path.join(tmp, "t4.json"))
    save_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
