"""The weight-only 8-bit kernel's tile sizes at decode sizes: which launch reads W fastest (a GPU).

    python scripts/w8_sweep.py --out OUT.json

For the Mistral-7B shape's four linears (qkv, o, gate_up, down) at one token (batch-1 decode), int8 and fp8 weights,
bf16 activations: every (BLOCK_N, BLOCK_K, programs per SM, num_warps, num_stages) of a small grid, timed with
triton.testing.do_bench_cudagraph (replays of a captured graph: the GPU's time, not the host's launches) against
the kernel's current choice and a bf16 F.linear of the same shape, as a fraction of the measured copy bandwidth
(each timing cycles through copies of W larger than the L2 cache); and the GEMV kernel (`_w8_gemv_kernel`: multiply
and sum on the CUDA cores, no tensor-core layouts) on the same grid.
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
import triton

from minivllm.kernels.w8_matmul import _split_k, _w8_gemv_kernel, _w8_matmul_kernel, w8_matmul
from minivllm.layers.quantization import dequantize, quantize_per_channel
from minivllm_lab.bench import roofline
from minivllm_lab.bench.metrics import hardware_name, source_commit
from minivllm_lab.bench.quantization import L2_BEATING_BYTES, graph_ms

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def _split_and_out(x, N, K, block_n, block_k, per_sm):
    """(output tiles, split-K factor, output buffer): w8_matmul's small-M rule with `per_sm` programs per
    multiprocessor, and the float32 buffer the split programs add into."""
    tiles = triton.cdiv(N, block_n)
    split_k = _split_k(x, tiles, K, block_k, per_sm, most=32)
    out = torch.zeros(x.shape[0], N, dtype=torch.float32, device=x.device) if split_k > 1 else torch.empty(
        x.shape[0], N, dtype=x.dtype, device=x.device)
    return tiles, split_k, out


def launch_gemv(x, w, scale, block_n, block_k, per_sm, warps, stages):
    (K,), N = x.shape[1:], w.shape[0]
    tiles, split_k, out = _split_and_out(x, N, K, block_n, block_k, per_sm)
    fp8 = w.dtype == torch.float8_e4m3fn
    _w8_gemv_kernel[(tiles, split_k)](x, w.view(torch.uint8) if fp8 else w, scale, out, N, K, w.stride(0),
                                      BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, FP8=fp8, num_warps=warps,
                                      num_stages=stages)
    return out if split_k == 1 else out.to(x.dtype)


def launch(x, w, scale, block_n, block_k, per_sm, warps, stages):
    (M, K), N = x.shape, w.shape[0]
    tiles, split_k, out = _split_and_out(x, N, K, block_n, block_k, per_sm)
    fp8 = w.dtype == torch.float8_e4m3fn
    block_m = 16
    _w8_matmul_kernel[(triton.cdiv(M, block_m), tiles, split_k)](
        x, w.view(torch.uint8) if fp8 else w, scale, out, M, N, K, x.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, FP8=fp8, num_warps=warps,
        num_stages=stages)
    return out if split_k == 1 else out.to(x.dtype)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    bw = roofline.measure_bandwidth_Bps()
    # 1 or 2 programs a multiprocessor leave K unsplit for most shapes: no zeroed float32 buffer, no cast after.
    grid = [("tile", *c) for c in itertools.product((32, 64), (256, 512), (1, 2, 4, 8), (4,), (4,))] + [
        ("gemv", *c) for c in itertools.product((4, 8, 16, 32), (256, 512, 1024), (1, 2, 4, 8), (4,), (3,))
        if c[0] * c[1] <= 8192]  # the float32 accumulator is BLOCK_N x BLOCK_K: larger ones spill
    result = {"hardware": hardware_name(), "commit": source_commit(), "bandwidth_GB_s": bw / 1e9,
              "command": "python scripts/w8_sweep.py", "rows": []}
    totals = {}
    for kind, m in itertools.product(("fp8", "int8"), (1,)):
        for name, (n, k) in SHAPES.items():
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            # Copies of W that together outgrow the L2 cache, read in turn: a replay must fetch W from memory.
            copies = [quantize_per_channel(torch.randn(n, k, device="cuda") * 0.02, kind)
                      for _ in range(max(2, -(-L2_BEATING_BYTES // (n * k))))]
            w, scale = copies[0]
            ref = x.float() @ (w.float() * scale[:, None]).T
            nbytes = n * k + m * k * 2 + m * n * 2

            def per_call_ms(run, *cfg):
                """Median GPU ms of one call, from graph replays that cycle through the copies."""
                return graph_ms(lambda c: run(x, *c, *cfg), copies)

            current = per_call_ms(w8_matmul)
            wide = [dequantize(wc, sc, torch.bfloat16) for wc, sc in copies[:max(1, len(copies) // 2)]]  # same bytes
            bf16_ms = graph_ms(lambda wc: F.linear(x, wc), wide)
            best = (current, "current")
            for cfg in grid:
                try:
                    run = launch if cfg[0] == "tile" else launch_gemv
                    out = run(x, w, scale, *cfg[1:])
                    if not torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item()):
                        continue
                    ms = per_call_ms(run, *cfg[1:])
                except Exception as e:  # out of shared memory, say
                    print(kind, m, name, cfg, type(e).__name__)
                    continue
                totals.setdefault((kind, m, cfg), []).append(ms)
                if ms < best[0]:
                    best = (ms, cfg)
            row = {"kind": kind, "tokens": m, "linear": name, "current_ms": current,
                   "current_fraction_of_bandwidth": nbytes / (current / 1e3) / bw,
                   "best_ms": best[0], "best_config": best[1],
                   "best_fraction_of_bandwidth": nbytes / (best[0] / 1e3) / bw,
                   "bf16_linear_ms": bf16_ms, "bf16_fraction_of_bandwidth": 2 * nbytes / (bf16_ms / 1e3) / bw}
            print(row)
            result["rows"].append(row)
            json.dump(result, open(args.out, "w"), indent=1)  # row by row: a run cut short keeps what it timed
    # the one config that is best summed over the four linears, per (kind, tokens)
    for kind, m in itertools.product(("fp8", "int8"), (1,)):
        cands = {cfg: sum(t) for (kd, mm, cfg), t in totals.items() if kd == kind and mm == m and len(t) == len(SHAPES)}
        cfg = min(cands, key=cands.get)
        cur = sum(r["current_ms"] for r in result["rows"] if r["kind"] == kind and r["tokens"] == m)
        print(kind, m, "best single config", cfg, f"{cands[cfg]:.4f} ms for the four linears against {cur:.4f} now")
        result.setdefault("best_single_config", []).append(
            {"kind": kind, "tokens": m, "config (kernel, BLOCK_N, BLOCK_K, programs per SM, warps, stages)": cfg,
             "four_linears_ms": cands[cfg], "current_four_linears_ms": cur})
    json.dump(result, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
