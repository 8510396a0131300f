#!/usr/bin/env bash
# The OpenAI extras on the GPU, in one run (sized for about 6 minutes on an H200):
#   1. their tests there: logprobs against transformers, n > 1 on shared blocks, penalties, and
#      tests/test_gpu.py's JSON schemas + logprobs + n answers on real SmolLM2 with CUDA graphs, overlap on and off;
#   2. python -m minivllm_lab.bench.structured: the per-step cost of a JSON schema on every request at batch 1, 64
#      and 256 (the Mistral-7B shape, bf16, dummy weights), W1 with a schema on every request against without,
#      and SmolLM2's valid-JSON rate with and without the grammar;
#   3. python -m minivllm_lab.bench.parallel_sampling: n = 4 against 4 separate requests (KV blocks, time), real
#      SmolLM2 in bf16, a prompt of 1000 tokens.
# Usage (repo root, SmolLM2 and the wheels installed: source scripts/gpu_parts.sh unpack3 or env):
#   bash scripts/gpu_structured.sh
# Everything comes back as one tarball, $OUT/structured_gpu.tgz (JSON and logs), rewritten after each part.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MINIVLLM_SMOKE=${MINIVLLM_SMOKE:-0}
bundle() { (cd "$OUT" && tar czf structured_gpu.tgz --exclude=structured_gpu.tgz *.json *.log *.txt 2>/dev/null); }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  python3 -c "import torch, triton, xgrammar; print('torch', torch.__version__, 'triton', triton.__version__,
              'xgrammar', xgrammar.__version__)"; } | tee "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_logprobs.py tests/test_parallel_sampling.py \
  tests/test_logits_processing.py "tests/test_gpu.py::test_json_schemas_logprobs_and_n_answers_on_the_gpu" 2>&1 \
  | tail -30 | tee "$OUT/gpu_tests_structured.log"
bundle
python3 -m minivllm_lab.bench.structured --out "$OUT/structured_gpu.json" 2>&1 | tee "$OUT/structured.log"
bundle
python3 -m minivllm_lab.bench.parallel_sampling --prompt-len 1000 --max-tokens 64 \
  --out "$OUT/parallel_sampling_gpu.json" 2>&1 | tee "$OUT/parallel_sampling.log"
echo "finished at $SECONDS s" | tee -a "$OUT/parallel_sampling.log"
bundle
