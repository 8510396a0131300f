"""The prefill attention kernel of this tree, timed on the Mistral-7B shape (32 query heads, 8 KV heads, 128
dims, bf16, blocks of 16 tokens): a 512-token chunk alone at several context lengths, 8k fresh prompt tokens
(in 8 prompts, and in one), and (where the kernel takes a mixed batch) the chunk behind 256 decoding
sequences. Run it in two trees to compare kernels (a GPU):

    python scripts/prefill_attention_ab.py --out OUT.json                               # this checkout
    python scripts/prefill_attention_ab.py --out OUT.json --sweep                       # + other tiles and grids
    (cd BASE && PYTHONPATH=$PWD python ../scripts/prefill_attention_ab.py --out B.json)   # an older tree
"""
from __future__ import annotations

import argparse
import inspect
import json

import torch
import triton

from minivllm.kernels.prefill_attention import paged_prefill_attention

HQ, HKV, D, BLOCK = 32, 8, 128, 16


def batch(q_lens: list[int], ctx_lens: list[int], dtype=torch.bfloat16):
    """q, caches, cu_seqlens_q, context_lens, block tables for sequences of these query and context lengths."""
    blocks = [triton.cdiv(c, BLOCK) for c in ctx_lens]
    pool = torch.randperm(sum(blocks), device="cuda").int()
    table = torch.full((len(ctx_lens), max(blocks)), -1, dtype=torch.int32, device="cuda")
    start = 0
    for i, n in enumerate(blocks):
        table[i, :n] = pool[start:start + n]
        start += n
    k = torch.randn(sum(blocks), BLOCK, HKV, D, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(sum(q_lens), HQ, D, device="cuda", dtype=dtype)
    cu = torch.tensor([0] + q_lens, device="cuda").cumsum(0).int()
    return q, k, v, cu, torch.tensor(ctx_lens, dtype=torch.int32, device="cuda"), table


def time_us(q_lens, ctx_lens, mixed_ok: bool) -> dict:
    q, k, v, cu, ctx, table = batch(q_lens, ctx_lens)
    params = inspect.signature(paged_prefill_attention).parameters
    kwargs = {"scale": D ** -0.5}
    if "max_query_len" in params:
        kwargs["max_query_len"] = max(q_lens)
    if "min_query_len" in params and mixed_ok:
        kwargs["min_query_len"] = 2

    def run():
        paged_prefill_attention(q, k, v, cu, ctx, table, **kwargs)

    run()
    us = triton.testing.do_bench(run, warmup=50, rep=200, return_mode="median") * 1e3
    # causal FLOPs: each query attends to the keys up to its position (4 * D per key per head: QK and PV)
    keys = sum(sum(c - n + i + 1 for i in range(n)) for n, c in zip(q_lens, ctx_lens) if n > 1 or not mixed_ok)
    return {"q_lens": f"{len(q_lens)} seqs, {sum(q_lens)} tokens", "max_ctx": max(ctx_lens), "us": us,
            "tflops": 4 * D * HQ * keys / (us * 1e-6) / 1e12}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--sweep", action="store_true", help="also time other (BLOCK_M, BLOCK_N, warps, stages) tiles "
                   "and other numbers of persistent programs (a tree whose kernel has them)")
    args = p.parse_args()
    out = {"gpu": torch.cuda.get_device_name(), "rows": cases()}
    if args.sweep:
        out["sweep"] = sweep()
    json.dump(out, open(args.out, "w"), indent=1)


def cases() -> list[dict]:
    rows = [time_us([512], [c], False) for c in (1024, 2048, 3072)]
    rows.append(time_us([1024] * 8, [1024] * 8, False))
    rows.append(time_us([8192], [8192], False))
    if "min_query_len" in inspect.signature(paged_prefill_attention).parameters:
        for c in (1024, 2048, 3072):
            row = time_us([1] * 256 + [512], [96] * 256 + [c], True)
            row["case"] = "256 decodes + the chunk (the prefill kernel's part)"
            rows.append(row)
    for r in rows:
        print(r)
    return rows


def sweep() -> list[dict]:
    """The same cases with the launch settings patched: tiles (BLOCK_M, BLOCK_N, warps, stages) at the default
    grid, then the default tiles with 1x and 4x the multiprocessors in programs."""
    from minivllm.kernels import prefill_attention as module
    tiles, programs = module._tiles, module._num_programs
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    variants = [((bm, bn, w, st), None) for bm, bn, w, st in
                [(64, 64, 4, 3), (128, 64, 4, 3), (64, 32, 4, 3), (128, 128, 8, 2), (256, 64, 8, 3)]]
    variants += [(None, n * sms) for n in (1, 4)]
    results = []
    for tile, num_programs in variants:
        module._tiles = (lambda *a, t=tile: t) if tile else tiles
        module._num_programs = (lambda *a, n=num_programs: n) if num_programs else programs
        print("tiles", tile or "default", "programs", num_programs or "default")
        try:
            results.append({"tiles": tile, "num_programs": num_programs, "rows": cases()})
        except Exception as error:  # a tile that does not fit shared memory
            results.append({"tiles": tile, "num_programs": num_programs, "error": repr(error)[:300]})
            print(results[-1])
    module._tiles, module._num_programs = tiles, programs
    return results


if __name__ == "__main__":
    main()
