#!/usr/bin/env bash
# The engine core's GPU run: what `minivllm serve` delivers of the engine's speed, with the engine core in
# a process of its own and in a thread of the server (--no-engine-core-process), on the H200.
#   1. W3 offline, 1000 requests at once (scripts/serve_overhead.py: token ids only, and detokenizing);
#   2. for each mode, one server: W3 with all 1000 requests at once (rate inf), then 1000 requests per
#      rate at 40, 80, 120 and 160 req/s (Poisson), through the chat endpoint, until the reading-speed SLO
#      breaks (TTFT p99 <= 1 s, TPOT p99 <= 190 ms). The engine's ceiling (about 16k tok/s, 150 tokens
#      an answer) is near 106 req/s, so the sweep must break by 160.
# The Mistral-7B-Instruct shape in bf16 with random weights (load_format dummy), the word tokenizer.
# SERVE_ARGS adds flags to every server (e.g. "--max-num-seqs 512").
# CLIENTS=N deals the requests out to N client processes (one Python client saturates its core first).
# A mode may end in "-1thread": the server runs with OMP_NUM_THREADS=1 (one intra-op thread for torch's
# host-side work; by default torch starts one per core and they spin between the core's tiny host ops).
# Usage (repo root, wheels installed: source scripts/gpu_parts.sh unpack1 or env): bash scripts/gpu_engine_core.sh
# Everything comes back as $OUT/engine_core_gpu.tgz (JSON and logs).
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MINIVLLM_SMOKE=0
RATES=${RATES:-inf,40,80,120,160} PROMPTS=${PROMPTS:-1000} MODES=${MODES:-process thread} CLIENTS=${CLIENTS:-1}
FOLDER=/tmp/mistral-7b-words PORT=8012
HW="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), Mistral-7B-Instruct shape, bf16, random weights"
bundle() { (cd "$OUT" && tar czf engine_core_gpu.tgz --exclude=engine_core_gpu.tgz *.json *.log 2>/dev/null); }

python3 -c "import sys; from minivllm_lab.bench.word_model import write_word_model; from minivllm.models.presets import MISTRAL_7B_CONFIG; write_word_model(sys.argv[1], MISTRAL_7B_CONFIG)" "$FOLDER"
[ "${SKIP_OFFLINE:-0}" = 1 ] || python3 scripts/serve_overhead.py --out "$OUT/w3_offline.json" 2>&1 | tee "$OUT/w3_offline.log"
bundle
for mode in $MODES; do
  flag=--engine-core-process; [ "${mode%-1thread}" = thread ] && flag=--no-engine-core-process
  threads=; [ "${mode%-1thread}" != "$mode" ] && threads=1
  env ${threads:+OMP_NUM_THREADS=$threads} python3 -m minivllm serve "$FOLDER" --load-format dummy --max-model-len 4096 --served-model-name w3-model \
    --host 127.0.0.1 --port $PORT --log-level warning $flag ${SERVE_ARGS:-} > "$OUT/server_$mode.log" 2>&1 &
  server=$!
  for i in $(seq 300); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break
    kill -0 $server 2>/dev/null || { echo "the server exited:"; tail -20 "$OUT/server_$mode.log"; exit 1; }; sleep 1; done
  python3 -m minivllm_lab.bench.serve --base-url http://127.0.0.1:$PORT --endpoint chat --label "minivllm ($mode)" \
    --request-rate "$RATES" --num-prompts "$PROMPTS" --num-clients "$CLIENTS" --vocab-size 32000 --timeout 600 --hardware "$HW" \
    --out "$OUT/w3_served_$mode.json" 2>&1 | tee "$OUT/w3_served_$mode.log"
  curl -s http://127.0.0.1:$PORT/metrics | grep -E "^minivllm:(num_preemptions_total|generation_tokens_total)" \
    | tee -a "$OUT/w3_served_$mode.log"
  kill -INT $server; for i in $(seq 20); do kill -0 $server 2>/dev/null || break; sleep 1; done
  kill -9 $server 2>/dev/null; wait $server 2>/dev/null
  bundle
done
