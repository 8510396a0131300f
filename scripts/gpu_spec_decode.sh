#!/usr/bin/env bash
# Speculative decoding on the GPU, in one run (sized for about 6 minutes on an H200):
#   1. the GPU tests of speculative decoding (tests/test_gpu.py: verify steps replayed as CUDA graphs give the
#      plain engine's tokens and the eager engine's, a draft model's runner replays graphs too);
#   2. python -m minivllm_lab.bench.spec_decode, which measures
#      - the Mistral-7B-Instruct shape (bf16, random weights): a batch-1 step through the runner and the paged
#        cache, a decode against verifies of k = 1..8 guesses, replayed as CUDA graphs and eager (CUDA events,
#        3 warm-up steps, medians of 20);
#      - real SmolLM2-135M with CUDA graphs, batch 1: tasks that copy their input and free chat, speculation off
#        against n-gram k = 2, 4, 6 (and k = 6 fixed, and a draft made of its first 8 layers), the greedy text
#        checked identical, output tok/s and speed-ups; then the copy tasks at batch 1, 8 and 32;
#   3. the rest of tests/test_gpu.py.
# Usage (repo root, SmolLM2 installed: source scripts/gpu_parts.sh unpack3 or env): bash scripts/gpu_spec_decode.sh
# MINIVLLM_SMOKE=1 bash scripts/gpu_spec_decode.sh: the same steps on a tiny random model, on any machine (on a
# CPU the GPU tests are skipped and nothing is replayed: it checks that the script runs).
# Everything comes back as one tarball, $OUT/spec_decode_gpu.tgz (JSON and logs), rewritten after each part.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MINIVLLM_SMOKE=${MINIVLLM_SMOKE:-0}
bundle() { (cd "$OUT" && tar czf spec_decode_gpu.tgz --exclude=spec_decode_gpu.tgz *.json *.log *.txt 2>/dev/null); }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/gpu.txt"
SPEC_TESTS="verify_steps or draft_models_runner"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "$SPEC_TESTS" 2>&1 | tee "$OUT/gpu_tests_spec.log"
bundle
args=(--verify-model mistral-7b --ks 2,4,6 --max-tokens 128 --batches 1,8,32)
[ "$MINIVLLM_SMOKE" = 1 ] && args=(--smoke)
python3 -m minivllm_lab.bench.spec_decode "${args[@]}" --out "$OUT/spec_decode_gpu.json" 2>&1 | tee "$OUT/spec_decode.log"
echo "measured by $SECONDS s" | tee -a "$OUT/spec_decode.log"
bundle
# Last, the engine's other GPU tests (the decode graphs' choice changed too): they may be cut by the call's limit.
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "not ($SPEC_TESTS)" 2>&1 | tee "$OUT/gpu_tests_rest.log"
echo "finished at $SECONDS s" | tee -a "$OUT/gpu_tests_rest.log"
bundle
