#!/usr/bin/env bash
# Issue 31's GPU run (mixed steps graphed, defaults sized by the device), one NVIDIA H200. Carry .gpu1 (the serving
# wheels, scripts/gpu_parts.sh prepare) with the tree; each part fits one 10-minute call:
#   there:  source scripts/gpu_parts.sh unpack1 && bash scripts/gpu_zero_overhead.sh mixed      # + the GPU tests
#           source scripts/gpu_parts.sh env && bash scripts/gpu_zero_overhead.sh capacity       # a warm machine
# JSON, profile and logs come back as $OUT/zero_overhead_gpu.tgz; the two JSON files go to figures/.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MINIVLLM_SMOKE=0 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
bundle() { (cd "$OUT" && tar czf zero_overhead_gpu.tgz --exclude=zero_overhead_gpu.tgz *.json *.log *.txt 2>/dev/null); }
case "$1" in
  mixed)   # BASE=<a git archive of an older tree> also times that tree's prefill kernel
    python3 -m pytest -q -m gpu tests/test_gpu.py tests/test_cuda_graphs.py tests/test_mixed_graphs.py \
      2>&1 | tail -30 | tee "$OUT/gpu_tests.log"
    python3 -m pytest -q tests/test_kernel_prefill_attention.py tests/test_kernel_decode_attention.py \
      tests/test_kernel_fp8_kv.py 2>&1 | tail -5 | tee -a "$OUT/gpu_tests.log"
    python3 scripts/prefill_attention_ab.py --sweep --out "$OUT/prefill_now.json" > "$OUT/prefill_ab.log" 2>&1
    if [ -n "${BASE:-}" ]; then
      (cd "$BASE" && PYTHONPATH="/tmp/site:$PWD" python3 ../scripts/prefill_attention_ab.py --out "$OUT/prefill_base.json")
    fi >> "$OUT/prefill_ab.log" 2>&1
    python3 -m minivllm_lab.bench.mixed_step --out "$OUT/mixed_step_h200.json" 2>&1 | tee "$OUT/mixed_step.log"
    python3 scripts/w3_offline_profile.py --out "$OUT/w3_offline_profile.json" 2>&1 | tail -30 | tee "$OUT/w3.log"
    bundle ;;
  capacity)
    python3 scripts/serving_capacity.py --out "$OUT/serving_capacity_h200.json" 2>&1 | tee "$OUT/serving_capacity.log"
    bundle ;;
  *) echo "usage: bash scripts/gpu_zero_overhead.sh mixed|capacity"; exit 2 ;;
esac
