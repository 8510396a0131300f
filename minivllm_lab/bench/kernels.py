"""Each Triton kernel against its torch reference, over a sweep of sizes (as Triton's tutorials do):
time, and how close it comes to the hardware. Decode attention and the elementwise kernels move bytes
and do little arithmetic, so their limit is bandwidth: achieved GB/s = bytes that must move / time,
against the bandwidth of a device-to-device copy. Prefill attention is arithmetic: achieved TFLOP/s
against the measured matmul rate.

    python -m minivllm_lab.bench.kernels              # a GPU run: table, JSON and plot in figures/
    python -m minivllm_lab.bench.kernels --smoke      # tiny shapes, any machine (CPU: Triton's interpreter)

Run on a CPU, set TRITON_INTERPRET=1 before anything imports triton (the CLI does it for you).
"""
from __future__ import annotations

import argparse
import os
import random
import time
from dataclasses import dataclass
from typing import Callable

import torch

from . import bench_extra

# The sweeps: what grows along each curve. Elementwise kernels: tokens in the step; decode attention:
# sequences of DECODE_CONTEXT tokens; prefill attention: the length of one prompt, computed in one chunk.
TOKENS = [16, 64, 256, 1024, 4096, 16384]
DECODE_BATCHES, DECODE_CONTEXT = [1, 2, 4, 8, 16, 32, 64], 4096
PREFILL_LENS = [256, 512, 1024, 2048, 4096, 8192]
SMOKE_TOKENS, SMOKE_BATCHES, SMOKE_CONTEXT, SMOKE_PREFILL = [16, 64], [1, 3], 70, [24, 40]
BLOCK = 16  # KV-cache block size, the engine's default


@dataclass
class KernelCase:
    kernel: str               # one curve of the plot: "RMSNorm + residual", ...
    size: int                 # its x value
    triton: Callable[[], object]
    torch: Callable[[], object]
    bytes_moved: int          # the bytes the operation must read and write at least
    flops: int = 0            # for compute-bound kernels (prefill attention)


@dataclass
class Shape:
    """The layer sizes the kernels see (a model's hidden size, FFN size and heads)."""
    hidden: int = 4096        # Mistral-7B's
    ffn: int = 14336
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128

    @classmethod
    def from_config(cls, cfg) -> "Shape":
        """From a ModelConfig (or roofline.ModelShape): hidden_size, intermediate_size, heads, head_dim."""
        from .roofline import ModelShape
        s = ModelShape.from_config(cfg)
        return cls(s.hidden_size, s.intermediate_size, s.num_heads, s.num_kv_heads, s.head_dim)


SMOKE_SHAPE = Shape(256, 384, 4, 2, 32)


def _paged_cache(num_seqs, context, kv_heads, head_dim, block_size, dtype, device, seed=0):
    """A KV cache holding `num_seqs` sequences of `context` tokens in shuffled blocks."""
    blocks_per_seq = -(-context // block_size)
    order = list(range(num_seqs * blocks_per_seq))
    random.Random(seed).shuffle(order)  # a real pool is fragmented: no sequence is contiguous
    block_tables = torch.tensor(order, dtype=torch.int32, device=device).view(num_seqs, blocks_per_seq)
    shape = (num_seqs * blocks_per_seq, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    return k_cache, v_cache, block_tables


def kernel_cases(device, dtype, shape: Shape | None = None, smoke: bool = False) -> list[KernelCase]:
    """Every kernel at every size of its sweep. The tensors of a case are made when its functions are
    first called and dropped with them, so only one case's tensors are alive at a time."""
    shape = SMOKE_SHAPE if smoke else (shape or Shape())
    tokens = SMOKE_TOKENS if smoke else TOKENS
    batches, context = (SMOKE_BATCHES, SMOKE_CONTEXT) if smoke else (DECODE_BATCHES, DECODE_CONTEXT)
    prefill_lens = SMOKE_PREFILL if smoke else PREFILL_LENS
    e = torch.tensor([], dtype=dtype).element_size()
    h, hq, hkv, d = shape.hidden, shape.num_heads, shape.num_kv_heads, shape.head_dim
    cases = [KernelCase("RMSNorm + residual", t, *_lazy(_rmsnorm, t, h, dtype, device), 4 * t * h * e) for t in tokens]
    cases += [KernelCase("SiLU-and-mul", t, *_lazy(_silu, t, shape.ffn, dtype, device), 3 * t * shape.ffn * e)
              for t in tokens]
    cases += [KernelCase("rotary q and k", t, *_lazy(_rotary, t, hq, hkv, d, dtype, device), 2 * t * (hq + hkv) * d * e)
              for t in tokens]
    cases += [KernelCase("KV-cache store", t, *_lazy(_store, t, hkv, d, dtype, device), 4 * t * hkv * d * e)
              for t in tokens]
    cases += [KernelCase("decode attention", b, *_lazy(_decode, b, context, hq, hkv, d, dtype, device),
                         2 * b * context * hkv * d * e + 2 * b * hq * d * e) for b in batches]
    cases += [KernelCase("prefill attention", n, *_lazy(_prefill, n, hq, hkv, d, dtype, device),
                         2 * n * hkv * d * e + 2 * n * hq * d * e, flops=4 * hq * d * (n * (n + 1) // 2))
              for n in prefill_lens]  # causal: query i sees i + 1 keys; q.K and p.V, 2 FLOPs per multiply-add
    return cases


def _lazy(make, *args):
    """(triton_fn, torch_fn) that build the case's tensors on their first call, once."""
    built = {}

    def get():
        if not built:
            built.update(zip(("triton", "torch"), make(*args)))
        return built
    return (lambda: get()["triton"](), lambda: get()["torch"]())


def _rmsnorm(t, h, dtype, device):
    from minivllm.kernels import rms_norm
    from minivllm.layers.basic import RMSNorm
    x, res = torch.randn(t, h, dtype=dtype, device=device), torch.randn(t, h, dtype=dtype, device=device)
    norm = RMSNorm(h, 1e-5).to(device=device, dtype=dtype)
    return lambda: rms_norm(x, norm.weight, 1e-5, res), lambda: norm(x, res)


def _silu(t, ffn, dtype, device):
    from minivllm.kernels import silu_and_mul
    from minivllm.layers.basic import silu_and_mul as silu_and_mul_ref
    gate_up = torch.randn(t, 2 * ffn, dtype=dtype, device=device)
    return lambda: silu_and_mul(gate_up), lambda: silu_and_mul_ref(gate_up)


def _rotary(t, hq, hkv, d, dtype, device):
    from minivllm.kernels import apply_rotary_
    from minivllm.layers.basic import RotaryEmbedding
    rope = RotaryEmbedding(d, 8192, 1e6).to(device)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, dtype=dtype, device=device)  # q and k: strided views, as in the model
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.view(t, hq, d), k.view(t, hkv, d)
    positions = torch.randint(0, 8192, (t,), device=device)
    return lambda: apply_rotary_(positions, q, k, rope.cos, rope.sin), lambda: rope(positions, q, k)


def _store(t, hkv, d, dtype, device):
    from minivllm.attention import torch_ref
    from minivllm.kernels import store_kv
    k_cache, v_cache, _ = _paged_cache(-(-t // BLOCK), BLOCK, hkv, d, BLOCK, dtype, device)
    k, v = torch.randn(t, hkv, d, dtype=dtype, device=device), torch.randn(t, hkv, d, dtype=dtype, device=device)
    slots = torch.randperm(t, device=device)
    return (lambda: store_kv(k, v, k_cache, v_cache, slots),
            lambda: torch_ref.store_kv(k, v, k_cache, v_cache, slots))


def _decode(batch, context, hq, hkv, d, dtype, device):
    from minivllm.attention import AttentionMetadata, torch_ref
    from minivllm.kernels import paged_decode_attention
    k_cache, v_cache, tables = _paged_cache(batch, context, hkv, d, BLOCK, dtype, device)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, hq, d, dtype=dtype, device=device)
    meta = torch_ref.TorchAttentionMetadata.build(AttentionMetadata(
        torch.arange(batch + 1, dtype=torch.int32, device=device), lens,
        torch.zeros(batch, dtype=torch.int64, device=device), tables, BLOCK, 1, context,
        num_decodes=batch, max_decode_context_len=context))
    return (lambda: paged_decode_attention(q, k_cache, v_cache, tables, lens, d ** -0.5),
            lambda: torch_ref.paged_attention(q, k_cache, v_cache, meta, d ** -0.5))


def _prefill(n, hq, hkv, d, dtype, device):
    from minivllm.attention import AttentionMetadata, torch_ref
    from minivllm.kernels import paged_prefill_attention
    k_cache, v_cache, tables = _paged_cache(1, n, hkv, d, BLOCK, dtype, device)
    q = torch.randn(n, hq, d, dtype=dtype, device=device)
    cu = torch.tensor([0, n], dtype=torch.int32, device=device)
    lens = torch.tensor([n], dtype=torch.int32, device=device)
    meta = torch_ref.TorchAttentionMetadata.build(
        AttentionMetadata(cu, lens, torch.zeros(n, dtype=torch.int64, device=device), tables, BLOCK, n, n))
    return (lambda: paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, d ** -0.5),
            lambda: torch_ref.paged_attention(q, k_cache, v_cache, meta, d ** -0.5))


def _time_ms(fn, on_gpu: bool) -> float:
    """Median ms of one call. On a GPU Triton's do_bench: it queues many calls back to back, so a
    short kernel is not charged for its own launch, and clears the L2 cache between them, so no
    call reads what the previous one left there."""
    if on_gpu:
        import triton.testing
        return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")  # warmup, rep: ms
    from .metrics import cuda_time_ms, median
    return median(cuda_time_ms(fn, warmup=1, repeats=1, device="cpu"))


def run_kernel_bench(device=None, dtype=torch.bfloat16, shape: Shape | None = None, smoke: bool = False) -> dict:
    """Median time of each kernel and of its torch reference at every size of its sweep, as GB/s (and
    TFLOP/s where it computes), with the ceilings measured in the same run on a GPU."""
    from .metrics import hardware_name
    from .roofline import measure_bandwidth_Bps, measure_matmul_flops
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = device.type == "cuda"
    ceilings = {}
    if on_gpu:
        ceilings = {"bandwidth_Bps": measure_bandwidth_Bps(device),
                    "matmul_flops": measure_matmul_flops(device, dtype=dtype)}
    rows = []
    with torch.inference_mode():
        for case in kernel_cases(device, dtype, shape, smoke):
            row = {"kernel": case.kernel, "size": case.size}
            for impl in ("triton", "torch"):
                ms = _time_ms(getattr(case, impl), on_gpu)
                row[f"{impl}_ms"] = ms
                row[f"{impl}_GBps"] = case.bytes_moved / (ms / 1e3) / 1e9
                if case.flops:
                    row[f"{impl}_TFLOPs"] = case.flops / (ms / 1e3) / 1e12
            row["speedup"] = row["torch_ms"] / row["triton_ms"]
            if ceilings:
                row["triton_bandwidth_fraction"] = row["triton_GBps"] * 1e9 / ceilings["bandwidth_Bps"]
                if case.flops:
                    row["triton_matmul_fraction"] = row["triton_TFLOPs"] * 1e12 / ceilings["matmul_flops"]
            rows.append(row)
            case.triton = case.torch = None  # the case's tensors go with its functions
            if on_gpu:
                torch.cuda.empty_cache()
    return {"hardware": hardware_name(), "dtype": str(dtype).removeprefix("torch."), "smoke": smoke,
            "shape": vars(SMOKE_SHAPE if smoke else (shape or Shape())), "decode_context": SMOKE_CONTEXT if smoke
            else DECODE_CONTEXT, "block_size": BLOCK, "ceilings": ceilings, "rows": rows}


X_LABELS = {"decode attention": "batch (sequences of {context} tokens)", "prefill attention": "prompt length (tokens)"}


def plot_kernel_bench(result: dict, path: str, title: str | None = None) -> str:
    """One panel per kernel: throughput vs size, the Triton kernel and its torch reference, with the
    measured ceiling dashed (bandwidth in GB/s; for prefill attention the matmul rate in TFLOP/s)."""
    with bench_extra():
        import matplotlib.pyplot as plt
    kernels = list(dict.fromkeys(r["kernel"] for r in result["rows"]))
    ceil = result["ceilings"]
    fig, axes = plt.subplots(2, -(-len(kernels) // 2), figsize=(5 * -(-len(kernels) // 2), 8), squeeze=False)
    for ax, kernel in zip(axes.flat, kernels):
        rows = [r for r in result["rows"] if r["kernel"] == kernel]
        flops = "triton_TFLOPs" in rows[0]
        unit, key = ("TFLOP/s", "TFLOPs") if flops else ("GB/s", "GBps")
        x = [r["size"] for r in rows]
        ax.plot(x, [r[f"triton_{key}"] for r in rows], "o-", color="tab:orange", label="Triton kernel")
        ax.plot(x, [r[f"torch_{key}"] for r in rows], "s--", color="tab:gray", label="torch reference")
        if ceil:
            limit = ceil["matmul_flops"] / 1e12 if flops else ceil["bandwidth_Bps"] / 1e9
            ax.axhline(limit, color="black", ls="--", lw=1,
                       label=(f"measured matmul {limit:,.0f} TFLOP/s" if flops
                              else f"measured bandwidth {limit:,.0f} GB/s"))
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, None)
        ax.set(title=kernel, ylabel=unit if ceil else f"{unit} (interpreter: not a speed)",
               xlabel=X_LABELS.get(kernel, "tokens").format(context=result["decode_context"]))
        ax.legend(fontsize=8, loc="best")
    for ax in list(axes.flat)[len(kernels):]:
        ax.axis("off")
    fig.suptitle(title or f"Triton kernels vs torch, {result['dtype']}, {result['hardware']}")
    fig.tight_layout()
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return path


COLUMNS = ["kernel", "size", "triton_ms", "torch_ms", "speedup", "triton_GBps", "torch_GBps",
           "triton_bandwidth_fraction", "triton_TFLOPs", "torch_TFLOPs", "triton_matmul_fraction"]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m minivllm_lab.bench.kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes, any machine")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--out", default=None, help="JSON path (default: figures/10_kernels.json; the plot beside it)")
    args = p.parse_args(argv)
    if args.smoke:
        os.environ["MINIVLLM_SMOKE"] = "1"  # figures go to a scratch folder
    from ..machine import figures_dir
    from .metrics import format_table, save_json
    result = run_kernel_bench(dtype=getattr(torch, args.dtype), smoke=args.smoke)
    print(result["hardware"])
    print(format_table(result["rows"], COLUMNS))
    out = args.out or figures_dir() / "10_kernels.json"
    save_json(out, result)
    print(f"results: {out}, plot: {plot_kernel_bench(result, str(out).removesuffix('.json') + '.png')}")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    main()


def store_kv_launch_cost(tokens=(1, 16, 64, 256, 1024), calls: int = 100, num_kv_heads: int = 8,
                         head_dim: int = 128, dtype=torch.bfloat16) -> list[dict]:
    """The KV-cache store at decode sizes, the Triton kernel against torch's indexed copy, three ways (CUDA only):
    - `eager_us`: time per call of `calls` calls back to back (the host launches each one: what a step without
      CUDA graphs pays);
    - `gpu_us`: the GPU time of its kernels alone (torch.profiler), per call;
    - `graph_us`: time per call when the `calls` calls are captured in one CUDA graph and replayed (how the
      engine's decode steps run it, notebook 11).
    A single call timed between two CUDA events (the sweep above) measures the launch as much as the kernel."""
    from minivllm.attention import torch_ref
    from minivllm.kernels import store_kv

    from .profile import profiler  # (acc_events=True: no warning from torch 2.10 to 2.12)

    blocks = 4096
    k_cache = torch.zeros(blocks, BLOCK, num_kv_heads, head_dim, device="cuda", dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    rows = []
    for n in tokens:
        k = torch.randn(n, num_kv_heads, head_dim, device="cuda", dtype=dtype)
        v = torch.randn_like(k)
        slots = torch.randperm(blocks * BLOCK, device="cuda")[:n]
        for impl, store in (("triton", store_kv), ("torch", torch_ref.store_kv)):
            def many():
                for _ in range(calls):
                    store(k, v, k_cache, v_cache, slots)
            many()  # warm-up (Triton compiles here)
            torch.cuda.synchronize()
            start = time.perf_counter()
            many()
            torch.cuda.synchronize()
            eager_us = (time.perf_counter() - start) / calls * 1e6
            with profiler([torch.profiler.ProfilerActivity.CUDA]) as prof:
                many()
                torch.cuda.synchronize()
            gpu_us = sum(e.self_device_time_total for e in prof.key_averages()
                         if e.device_type == torch.autograd.DeviceType.CUDA) / calls
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                many()  # (a capture must follow a warm-up on a side stream)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                many()
            graph.replay()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(10):
                graph.replay()
            torch.cuda.synchronize()
            graph_us = (time.perf_counter() - start) / (10 * calls) * 1e6
            rows.append({"tokens": n, "impl": impl, "eager_us": round(eager_us, 2), "gpu_us": round(gpu_us, 2),
                         "graph_us": round(graph_us, 2)})
    return rows
