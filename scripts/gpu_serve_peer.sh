#!/usr/bin/env bash
# transformers' own OpenAI-compatible server (`transformers serve --continuous-batching`) under the
# serving benchmark, on the GPU machine: the Mistral-7B-Instruct shape with random weights saved to disk,
# the word tokenizer of minivllm_lab.bench.word_model, W3 through the chat endpoint, as notebook 13 measures
# minivllm. transformers runs far below minivllm's rates, so fewer requests and low rates fit one call.
# Needs fastapi, uvicorn, pydantic and openai on the machine (wheels carried, on PYTHONPATH).
# Usage (repo root): bash scripts/gpu_serve_peer.sh   -> $OUT/13_serving_transformers.json
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1
FOLDER=/tmp/mistral-7b-words PORT=8011
RATES=${RATES:-1,2,4} PROMPTS=${PROMPTS:-100}
python3 - "$FOLDER" <<'PY' 2>&1 | tee "$OUT/peer_weights.log" || exit 1
import sys, time, torch, transformers
from minivllm_lab.bench.word_model import write_word_model
from minivllm.models.presets import MISTRAL_7B_CONFIG
start = time.time()
folder = write_word_model(sys.argv[1], MISTRAL_7B_CONFIG)
config = transformers.AutoConfig.from_pretrained(folder)
with torch.device("cuda"):  # random initialisation of 7B parameters is minutes on a CPU, seconds here
    model = transformers.MistralForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(folder)
print(f"random Mistral-7B-shaped weights written to {folder} in {time.time() - start:.0f} s")
PY
transformers serve "$FOLDER" --continuous-batching --host 127.0.0.1 --port $PORT --dtype bfloat16 \
  --device cuda:0 > "$OUT/peer_server.log" 2>&1 &
server=$!
for i in $(seq 300); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 1; done
curl -sf http://127.0.0.1:$PORT/health || { echo "transformers serve did not start"; tail -50 "$OUT/peer_server.log"; kill $server; exit 1; }
python3 -m minivllm_lab.bench.serve --base-url http://127.0.0.1:$PORT --endpoint chat --model "$FOLDER" \
  --label "transformers serve" --request-rate "$RATES" --num-prompts "$PROMPTS" --vocab-size 32000 --timeout 1200 \
  --hardware "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), Mistral-7B-Instruct shape, bf16, random weights" \
  --out "$OUT/13_serving_transformers.json" 2>&1 | tee "$OUT/peer_bench.log"
# transformers serve took minutes to exit after SIGINT once: give it 20 s, then kill it.
kill -INT $server; for i in $(seq 20); do kill -0 $server 2>/dev/null || break; sleep 1; done
kill -9 $server 2>/dev/null; wait $server 2>/dev/null
