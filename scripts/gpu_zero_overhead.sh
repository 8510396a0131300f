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
  mixed)
    python3 -m pytest -q -m gpu tests/test_gpu.py tests/test_cuda_graphs.py tests/test_mixed_graphs.py \
      2>&1 | tail -30 | tee "$OUT/gpu_tests.log"
    python3 -m minivllm_lab.bench.mixed_step --out "$OUT/mixed_step_h200.json" 2>&1 | tee "$OUT/mixed_step.log"
    bundle ;;
  capacity)
    python3 scripts/serving_capacity.py --out "$OUT/serving_capacity_h200.json" 2>&1 | tee "$OUT/serving_capacity.log"
    bundle ;;
  *) echo "usage: bash scripts/gpu_zero_overhead.sh mixed|capacity"; exit 2 ;;
esac
