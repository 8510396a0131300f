#!/usr/bin/env bash
# The GPU runs behind the README's numbers, each sized for one 10-minute call on the GPU machine.
# From the repo root:
#   bash scripts/gpu_bench.sh tests   # toolchain check, GPU tests, kernel benchmark (notebook 10's numbers)
#   bash scripts/gpu_bench.sh w1      # W1: every engine, the ablation, batch-1 decode and its profile
#   bash scripts/gpu_bench.sh w2      # W2: minivllm vs transformers' continuous batching, W2-shaped decode step profile
#   bash scripts/gpu_bench.sh w3      # W3-offline (1000 requests at once): minivllm vs transformers' continuous batching
#   bash scripts/gpu_bench.sh overlap # the step loop's run: GPU engine tests, then W1, W2 and W3-offline with minivllm
#                                     # (batch 1 and the decode profiles, W2's included), then W1 with transformers'
#                                     # continuous batching and the ablation (async scheduling off among the rows)
# Logs, JSON and plots go to $OUT (or ./gpu-out).
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MINIVLLM_SMOKE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
case "$1" in
  tests)
    # Triton builds its launcher with a C compiler and Python's headers the first time a kernel runs.
    { which gcc cc clang; python3 -c "import sysconfig, os; print('Python.h:', os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))"
      python3 -c "import torch; from minivllm.kernels import rms_norm; x = torch.randn(2, 64, device='cuda'); print('triton ok:', rms_norm(x, torch.ones(64, device='cuda'), 1e-5).shape)"
    } 2>&1 | tee "$OUT/toolchain.txt"
    python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tee "$OUT/gpu_tests.log"
    python3 -m minivllm_lab.bench.kernels --out "$OUT/10_kernels.json" 2>&1 | tee "$OUT/kernels.log" ;;
  w1)
    # recompute (no KV cache, ~65 s on W1) is left out to fit the call; notebook 02 measures it.
    python3 -m minivllm_lab.bench --workload w1 --ablation --engines hf-sequential,hf-static,hf-continuous,minivllm-static,minivllm \
      --out "$OUT/bench_w1.json" 2>&1 | tee "$OUT/bench_w1.log" ;;
  w2)
    # ~5.5 minutes on the H200: transformers 4.7 (~470 tok/s x 134k tokens), the rest under one.
    python3 -m minivllm_lab.bench --workload w2 --engines minivllm,hf-continuous \
      --out "$OUT/bench_w2.json" 2>&1 | tee "$OUT/bench_w2.log" ;;
  w3)
    # ~4 minutes on the H200: transformers 3.6 (~700 tok/s x 150k tokens), minivllm 11 s.
    python3 -m minivllm_lab.bench --workload w3-offline --engines minivllm,hf-continuous --no-decode \
      --out "$OUT/bench_w3_offline.json" 2>&1 | tee "$OUT/bench_w3_offline.log" ;;
  overlap)
    # ~8 minutes on the H200; each part writes its JSON as soon as it ends.
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log"
    python3 -m minivllm_lab.bench --workload w1,w2,w3-offline --engines minivllm \
      --out "$OUT/bench_w1_w2_w3.json" 2>&1 | tee "$OUT/bench_w1_w2_w3.log"
    python3 -m minivllm_lab.bench --workload w1 --engines hf-continuous,minivllm --ablation --no-decode \
      --out "$OUT/bench_w1.json" 2>&1 | tee "$OUT/bench_w1.log" ;;
  *) echo "usage: bash scripts/gpu_bench.sh tests|w1|w2|w3|overlap"; exit 2 ;;
esac
