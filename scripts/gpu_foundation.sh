#!/usr/bin/env bash
# The foundation's GPU run (issue 2): GPU tests, then the benchmark CLI on W1 with every engine,
# batch-1 decode and the decode-step profile. Run on the GPU machine from the repo root; logs
# and JSON go to $OUT (or ./gpu-out).
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MINIVLLM_SMOKE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log"
python3 -m minivllm.bench --workload w1 --out "$OUT/bench_w1.json" 2>&1 | tee "$OUT/bench_w1.log"
