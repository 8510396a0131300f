"""Where W2's decode steps spend their time, and whether the decode kernel's launch settings matter.

W2 (256 requests, prompts and answers of 100-1024 tokens) decodes at batch 256 with contexts around
a thousand tokens, a shape the bench CLI does not profile. This script, on a GPU:

1. times the paged decode kernel with other tile sizes, warps and pipeline stages (the package's are
   `_tile_size` and `_warps_and_stages`) at batch 64 x 4096 and 256 x 1024, as a fraction of the
   bandwidth measured in the same run; a setting that fails to compile is recorded as failed;
2. profiles decode steps of the Mistral-7B shape (bf16, dummy weights, CUDA graphs) at W2's shape,
   batch 256 x 1024 tokens, and at batch 128 x 1024 (`minivllm_lab.bench.profile`).

    python scripts/decode_sweep.py --out gpu-out/decode_sweep.json
"""
import argparse
import itertools
import json
from unittest import mock

import torch

from minivllm import LLM
from minivllm.kernels import decode_attention, paged_decode_attention
from minivllm_lab.bench import roofline
from minivllm_lab.bench.kernels import _paged_cache, _time_ms
from minivllm_lab.bench.profile import decode_step_profile


def profile_w2_shape(results: dict) -> None:
    llm = LLM("mistral-7b", load_format="dummy", dtype="bfloat16", max_model_len=2048, max_num_seqs=256)
    for batch in (128, 256):
        p = decode_step_profile(llm, batch=batch, context=1024, top=12)
        results[f"profile_batch{batch}_ctx1024"] = p
        print(f"batch {batch} x 1024: wall {p['wall_ms']:.2f} ms, GPU kernels {p['gpu_ms']:.2f} ms, "
              f"{p['kernels_per_step']:.0f} kernels")
        for k in p["top_kernels"]:
            print(f"   {k['ms_per_step']:7.3f} ms  {k['name']}")
    del llm
    torch.cuda.empty_cache()


def sweep_decode_kernel(results: dict, bandwidth: float) -> None:
    hkv, hq, d, block = 8, 32, 128, 16
    rows = []
    for batch, context in ((64, 4096), (256, 1024)):
        k_cache, v_cache, tables = _paged_cache(batch, context, hkv, d, block, torch.bfloat16, "cuda")
        q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device="cuda")
        lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
        bytes_moved = 2 * batch * context * hkv * d * 2 + 2 * batch * hq * d * 2
        for tile, warps, stages in itertools.product((32, 64, 128), (4, 8), (2, 3, 4)):
            row = {"batch": batch, "context": context, "tile": tile, "num_warps": warps, "num_stages": stages}
            try:
                with mock.patch.object(decode_attention, "_tile_size", lambda *_: tile), \
                     mock.patch.object(decode_attention, "_warps_and_stages", lambda *_: (warps, stages)):
                    ms = _time_ms(lambda: paged_decode_attention(q, k_cache, v_cache, tables, lens, d ** -0.5),
                                  on_gpu=True)
                row |= {"ms": ms, "bandwidth_fraction": bytes_moved / (ms * 1e-3) / bandwidth}
                result = f"{ms:.4f} ms, {row['bandwidth_fraction']:.1%} of bandwidth"
            except Exception as e:  # e.g. more shared memory than the GPU has: Triton's OutOfResources
                row["error"] = result = f"{type(e).__name__}: {e}"[:200]
            rows.append(row)
            print(f"batch {batch} x {context}, tile {tile}, {warps} warps, {stages} stages: {result}")
        k_cache = v_cache = None  # the next shape's cache takes their memory
        torch.cuda.empty_cache()
    results["decode_kernel_sweep"] = rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="decode_sweep.json")
    args = parser.parse_args()
    bandwidth = roofline.measure_bandwidth_Bps()
    results = {"hardware": torch.cuda.get_device_name(), "bandwidth_Bps": bandwidth}
    print(f"{results['hardware']}: {bandwidth / 1e12:.2f} TB/s")
    sweep_decode_kernel(results, bandwidth)
    profile_w2_shape(results)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
