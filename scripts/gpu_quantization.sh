#!/usr/bin/env bash
# Issue 32's GPU run (quantization), one NVIDIA H200, one call: the GPU tests of the quantized paths, then
# minivllm_lab.bench.quantization (Mistral-7B's shape in bf16, and a T4's budget with Llama-3.2-1B in fp16).
#   there:  MINIVLLM_COMMIT=<the commit copied> bash scripts/gpu_quantization.sh
# JSON and logs come back as $OUT/quantization_gpu.tgz; the JSON goes to figures/17_quantization.json.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MINIVLLM_SMOKE=0 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 -m pytest -q -m gpu tests/test_gpu_quantization.py 2>&1 | tail -30 | tee "$OUT/gpu_quantization_tests.log"
python3 -m minivllm_lab.bench.quantization --out "$OUT/17_quantization.json" 2>&1 | tee "$OUT/quantization.log"
(cd "$OUT" && tar czf quantization_gpu.tgz --exclude=quantization_gpu.tgz *.json *.log)
