"""Each Triton kernel against its torch reference, at Mistral-7B sizes: time, and how close it
comes to the hardware. Decode attention and the elementwise kernels move bytes and do little
arithmetic, so their limit is bandwidth: achieved GB/s = bytes that must move / time. Prefill
attention is arithmetic: achieved TFLOP/s against the measured matmul rate.

    python -m minivllm.bench.kernels              # a GPU run: table, JSON and plot in figures/
    python -m minivllm.bench.kernels --smoke      # tiny shapes, any machine (CPU: Triton's interpreter)

Run on a CPU, set TRITON_INTERPRET=1 before anything imports triton (the CLI does it for you).
"""
from __future__ import annotations

import argparse
import os
import random
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class KernelCase:
    name: str
    triton: Callable[[], object]
    torch: Callable[[], object]
    bytes_moved: int          # the bytes the operation must read and write at least
    flops: int = 0            # for compute-bound kernels (prefill attention)


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


def kernel_cases(device, dtype, smoke: bool = False) -> list[KernelCase]:
    from ..attention import AttentionMetadata, torch_ref
    from ..kernels import (apply_rotary_, paged_decode_attention, paged_prefill_attention, rms_norm, silu_and_mul,
                           store_kv)
    from ..models.layers import RMSNorm, RotaryEmbedding
    from ..models.layers import silu_and_mul as silu_and_mul_ref

    e = torch.tensor([], dtype=dtype).element_size()
    # Mistral-7B: hidden 4096, FFN 14336, 32 query heads and 8 KV heads of 128.
    tokens, hidden, ffn, hq, hkv, d = (64, 256, 384, 4, 2, 32) if smoke else (8192, 4096, 14336, 32, 8, 128)
    decode_batch, decode_context = (3, 70) if smoke else (64, 4096)
    small_batch = 1 if smoke else 2
    chunk, earlier = (40, 24) if smoke else (2048, 2048)
    block = 16
    rand = lambda *shape: torch.randn(*shape, dtype=dtype, device=device)  # noqa: E731
    cases = []

    x, res = rand(tokens, hidden), rand(tokens, hidden)
    norm = RMSNorm(hidden, 1e-5).to(device=device, dtype=dtype)
    cases.append(KernelCase(f"RMSNorm + residual [{tokens}, {hidden}]", lambda: rms_norm(x, norm.weight, 1e-5, res),
                            lambda: norm(x, res), 4 * tokens * hidden * e))

    mlp_tokens = tokens // 4
    gate_up = rand(mlp_tokens, 2 * ffn)
    cases.append(KernelCase(f"SiLU-and-mul [{mlp_tokens}, 2x{ffn}]", lambda: silu_and_mul(gate_up),
                            lambda: silu_and_mul_ref(gate_up), 3 * mlp_tokens * ffn * e))

    rope = RotaryEmbedding(d, 8192, 1e6).to(device)
    qkv = rand(tokens, (hq + 2 * hkv) * d)
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.view(tokens, hq, d), k.view(tokens, hkv, d)
    positions = torch.randint(0, 8192, (tokens,), device=device)
    cases.append(KernelCase(f"rotary q and k [{tokens} tokens]", lambda: apply_rotary_(positions, q, k, rope.cos, rope.sin),
                            lambda: rope(positions, q, k), 2 * tokens * (hq + hkv) * d * e))

    kv_cache_k, kv_cache_v, _ = _paged_cache(tokens // block, block, hkv, d, block, dtype, device)
    new_k, new_v = rand(tokens, hkv, d), rand(tokens, hkv, d)
    slots = torch.randperm(tokens, device=device)
    cases.append(KernelCase(f"KV-cache store [{tokens} tokens]", lambda: store_kv(new_k, new_v, kv_cache_k, kv_cache_v, slots),
                            lambda: torch_ref.store_kv(new_k, new_v, kv_cache_k, kv_cache_v, slots),
                            4 * tokens * hkv * d * e))

    for batch in (decode_batch, small_batch):
        k_cache, v_cache, tables = _paged_cache(batch, decode_context, hkv, d, block, dtype, device)
        lens = torch.full((batch,), decode_context, dtype=torch.int32, device=device)
        qd = rand(batch, hq, d)
        meta = torch_ref.TorchAttentionMetadata.build(AttentionMetadata(
            torch.arange(batch + 1, dtype=torch.int32, device=device), lens,
            torch.zeros(batch, dtype=torch.int64, device=device), tables, block, 1,
            decode_context, num_decodes=batch, max_decode_context_len=decode_context))
        cases.append(KernelCase(
            f"paged decode attention, batch {batch} x {decode_context} tokens",
            lambda qd=qd, k_cache=k_cache, v_cache=v_cache, tables=tables, lens=lens:
                paged_decode_attention(qd, k_cache, v_cache, tables, lens, d ** -0.5),
            lambda qd=qd, k_cache=k_cache, v_cache=v_cache, meta=meta:
                torch_ref.paged_attention(qd, k_cache, v_cache, meta, d ** -0.5),
            2 * batch * decode_context * hkv * d * e + 2 * batch * hq * d * e))

    context = earlier + chunk
    k_cache, v_cache, tables = _paged_cache(1, context, hkv, d, block, dtype, device)
    qp = rand(chunk, hq, d)
    cu = torch.tensor([0, chunk], dtype=torch.int32, device=device)
    lens = torch.tensor([context], dtype=torch.int32, device=device)
    meta = torch_ref.TorchAttentionMetadata.build(
        AttentionMetadata(cu, lens, torch.zeros(chunk, dtype=torch.int64, device=device), tables, block, chunk, context))
    visible_keys = sum(earlier + i + 1 for i in range(chunk))  # causal: query i sees earlier + i + 1 keys
    cases.append(KernelCase(
        f"paged prefill attention, {chunk}-token chunk after {earlier}",
        lambda: paged_prefill_attention(qp, k_cache, v_cache, cu, lens, tables, chunk, d ** -0.5),
        lambda: torch_ref.paged_attention(qp, k_cache, v_cache, meta, d ** -0.5),
        2 * context * hkv * d * e + 2 * chunk * hq * d * e, flops=4 * hq * d * visible_keys))
    return cases


def _time_ms(fn, on_gpu: bool) -> float:
    """Median ms of one call. On a GPU Triton's do_bench: it queues many calls back to back, so a
    short kernel is not charged for its own launch, and clears the L2 cache between them, so no
    call reads what the previous one left there."""
    if on_gpu:
        import triton.testing
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")  # warmup, rep: ms
    from .metrics import cuda_time_ms, median
    return median(cuda_time_ms(fn, warmup=1, repeats=1, device="cpu"))


def run_kernel_bench(device=None, dtype=torch.bfloat16, smoke: bool = False) -> dict:
    """Median time of each kernel and of its torch reference, as GB/s (and TFLOP/s where it
    computes), with the ceilings measured in the same run on a GPU."""
    from .metrics import hardware_name
    from .roofline import measure_bandwidth_Bps, measure_matmul_flops
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = device.type == "cuda"
    ceilings = {}
    if on_gpu:
        ceilings = {"bandwidth_Bps": measure_bandwidth_Bps(device), "matmul_flops": measure_matmul_flops(device, dtype=dtype)}
    rows = []
    with torch.inference_mode():
        for case in kernel_cases(device, dtype, smoke):
            row = {"kernel": case.name}
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
    return {"hardware": hardware_name(), "dtype": str(dtype).removeprefix("torch."), "smoke": smoke,
            "ceilings": ceilings, "rows": rows}


def plot_kernel_bench(result: dict, path: str) -> str:
    """Achieved GB/s of each kernel, Triton next to torch, against the measured bandwidth."""
    import matplotlib.pyplot as plt
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.5))
    y = range(len(rows))
    ax.barh([i - 0.2 for i in y], [r["triton_GBps"] for r in rows], height=0.4, label="Triton", color="tab:orange")
    ax.barh([i + 0.2 for i in y], [r["torch_GBps"] for r in rows], height=0.4, label="torch reference", color="tab:gray")
    bw = result["ceilings"].get("bandwidth_Bps")
    if bw:
        ax.axvline(bw / 1e9, color="black", linestyle="--", label=f"measured bandwidth {bw / 1e12:.2f} TB/s")
    ax.set_yticks(list(y), [r["kernel"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GB/s (bytes the operation must move / time)")
    ax.set_title(f"Triton kernels vs torch, {result['dtype']}, {result['hardware']}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m minivllm.bench.kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes, any machine")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--out", default=None, help="JSON path (default: figures/10_kernels.json; the plot beside it)")
    args = p.parse_args(argv)
    if args.smoke:
        os.environ["MINIVLLM_SMOKE"] = "1"  # figures go to a scratch folder
    from ..utils import figures_dir
    from .metrics import format_table, save_json
    result = run_kernel_bench(dtype=getattr(torch, args.dtype), smoke=args.smoke)
    print(result["hardware"])
    print(format_table(result["rows"], ["kernel", "triton_ms", "torch_ms", "speedup", "triton_GBps", "torch_GBps",
                                        "triton_bandwidth_fraction", "triton_TFLOPs", "triton_matmul_fraction"]))
    out = args.out or figures_dir() / "10_kernels.json"
    save_json(out, result)
    print(f"results: {out}, plot: {plot_kernel_bench(result, str(out).removesuffix('.json') + '.png')}")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    main()
