#!/usr/bin/env bash
# Issue 30's GPU check: the engine before its redesign in vLLM v1's shape (commit 4899290) and after it (this tree),
# side by side in one run on one GPU. Mistral-7B-Instruct shape, bf16, random weights (load_format dummy).
#   here, once:   rm -rf .old && mkdir .old && git archive 4899290 minivllm minivllm_lab scripts | tar -x -C .old
#                 (.old is git-ignored: carry it, with the wheels of scripts/gpu_parts.sh's .gpu1 for the servers)
#   there:        bash scripts/gpu_core_redesign.sh offline   # W1, W2, W3-offline and batch-1 decode, old then new, twice
#                 bash scripts/gpu_core_redesign.sh served    # W3 offline, then W3 served (1000 requests at once,
#                                                             # completions and chat), this tree; old with TREES="old new"
# JSON and logs come back as $OUT/core_redesign_gpu.tgz.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MINIVLLM_SMOKE=0
ROOT=$PWD HW="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), Mistral-7B-Instruct shape, bf16, random weights"
bundle() { (cd "$OUT" && tar czf core_redesign_gpu.tgz --exclude=core_redesign_gpu.tgz *.json *.log 2>/dev/null); }
tree_path() { [ "$1" = old ] && echo "$ROOT/.old" || echo "$ROOT"; }
case "$1" in
  offline)
    for round in ${ROUNDS:-1 2}; do for tree in old new; do
      PYTHONPATH=$(tree_path $tree)${PYTHONPATH:+:$PYTHONPATH} python3 -m minivllm_lab.bench --workload w1,w2,w3-offline \
        --engines minivllm --out "$OUT/bench_${tree}_$round.json" 2>&1 | tee "$OUT/bench_${tree}_$round.log"
      bundle
    done; done ;;
  served)
    FOLDER=/tmp/mistral-7b-words PORT=8013
    for tree in ${TREES:-new}; do
      export PYTHONPATH=$(tree_path $tree)${SITE_PATH:+:$SITE_PATH}
      python3 -c "import sys; from minivllm_lab.bench.word_model import write_word_model; from minivllm.models.presets import MISTRAL_7B_CONFIG; write_word_model(sys.argv[1], MISTRAL_7B_CONFIG)" "$FOLDER"
      python3 "$ROOT/scripts/serve_overhead.py" --out "$OUT/w3_offline_$tree.json" 2>&1 | tee "$OUT/w3_offline_$tree.log"
      for endpoint in completions chat; do  # a fresh server each: the second would find the first's prompts cached
        python3 -m minivllm serve "$FOLDER" --load-format dummy --max-model-len 4096 --served-model-name w3-model \
          --host 127.0.0.1 --port $PORT --log-level warning > "$OUT/server_${tree}_$endpoint.log" 2>&1 &
        server=$!
        for i in $(seq 300); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break
          kill -0 $server 2>/dev/null || { echo "the server exited:"; tail -20 "$OUT/server_${tree}_$endpoint.log"; exit 1; }
          sleep 1; done
        python3 -m minivllm_lab.bench.serve --base-url http://127.0.0.1:$PORT --endpoint $endpoint --request-rate inf \
          --num-prompts 1000 --num-clients 4 --vocab-size 32000 --timeout 600 --hardware "$HW" \
          --label "minivllm $tree ($endpoint)" --out "$OUT/w3_served_${tree}_$endpoint.json" 2>&1 \
          | tee "$OUT/w3_served_${tree}_$endpoint.log"
        kill -INT $server; for i in $(seq 20); do kill -0 $server 2>/dev/null || break; sleep 1; done
        kill -9 $server 2>/dev/null; wait $server 2>/dev/null
      done
      bundle
    done ;;
  *) echo "usage: bash scripts/gpu_core_redesign.sh offline|served"; exit 2 ;;
esac
