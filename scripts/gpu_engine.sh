#!/usr/bin/env bash
# The engine's GPU run (issue 3): GPU tests, then W1 and W2 with minivllm and transformers'
# continuous batching side by side (plus the other baselines on W1). Logs and JSON go to $OUT.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MINIVLLM_SMOKE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log"
python3 -m minivllm.bench --workload w1 --out "$OUT/bench_w1.json" 2>&1 | tee "$OUT/bench_w1.log"
python3 -m minivllm.bench --workload w2 --engines hf-continuous,minivllm --no-decode \
  --out "$OUT/bench_w2.json" 2>&1 | tee "$OUT/bench_w2.log"
