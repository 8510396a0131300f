#!/usr/bin/env bash
# The engine's GPU run (issue 3): all of gpu_foundation.sh (GPU tests; W1 with every engine,
# batch-1 decode, the decode-step profile), then W2 with minivllm and transformers' continuous
# batching side by side. Logs and JSON go to $OUT.
set -o pipefail
bash "$(dirname "$0")/gpu_foundation.sh" || exit 1
OUT=${OUT:-gpu-out}
PYTHONPATH=$PWD MINIVLLM_SMOKE=0 PYTHONUNBUFFERED=1 python3 -m minivllm.bench --workload w2 \
  --engines hf-continuous,minivllm --no-decode --out "$OUT/bench_w2.json" 2>&1 | tee "$OUT/bench_w2.log"
