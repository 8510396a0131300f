#!/usr/bin/env bash
# On one GPU, in one call: the GPU tests of the fp8 kernels, the linear layers (16-bit, weight-only, W8A8) and decode attention (16-bit and fp8 cache)
# timed for this checkout and for an older tree BASE (a `git archive` of a commit, git-ignored, carried with the
# call), each in its own process; then the mixed step's idle time and the weight-only kernel's launch sweep.
#   BASE=.atbase bash scripts/gpu_kernels_before_after.sh      # after `source scripts/gpu_parts.sh unpack1`
# Writes $OUT/kernels_now.json, $OUT/kernels_base.json, $OUT/gaps.json and $OUT/w8_sweep.json.
set -u
kernels='
import json, sys, torch
from minivllm.models.loader import resolve_model
from minivllm_lab.bench import roofline
from minivllm_lab.bench.metrics import hardware_name
from minivllm_lab.bench.quantization import decode_attention_kernel, linear_kernels
shape = roofline.ModelShape.from_config(resolve_model("mistral-7b").config)
bw = roofline.measure_bandwidth_Bps()
out = {"hardware": hardware_name(), "bandwidth_GB_s": bw / 1e9,
       "linear_kernels": linear_kernels(shape, torch.bfloat16, bw, (1, 16, 64, 256, 1024, 4096), ("int8", "fp8")),
       "decode_attention_kernel": decode_attention_kernel(shape, torch.bfloat16, bw, True)}
json.dump(out, open(sys.argv[1], "w"), indent=1)
'
timeout 100 python -m pytest -q -x tests/test_kernel_fp8_quant.py tests/test_kernel_fp8_kv.py \
  tests/test_kernel_decode_attention.py tests/test_kernel_prefill_attention.py 2>&1 | tail -3
timeout 80 python -m pytest -q -x -m gpu tests/test_gpu_quantization.py 2>&1 | tail -3
timeout 100 python -c "$kernels" "$OUT/kernels_now.json"
(cd "$BASE" && PYTHONPATH="/tmp/site:$PWD" timeout 100 python -c "$kernels" "$OUT/kernels_base.json")
timeout 170 python scripts/mixed_step_gaps.py --out "$OUT/gaps.json" 2>&1 | tail -40
timeout 150 python scripts/w8_sweep.py --out "$OUT/w8_sweep.json" 2>&1 | grep -v "^{'kind'" | tail -12
