#!/usr/bin/env bash
# Where a served step's time goes on the GPU: `minivllm serve` (engine core in its own process) under W3
# with all 1000 requests at once, while the CPU time of the frontend, of the core process and of the load
# client (one Python process too: it could be the limit) is sampled from /proc every 0.5 s, and py-spy
# (when the machine lets it attach) records all three for 8 s.
# The Mistral-7B-Instruct shape in bf16 with random weights. Usage (repo root, wheels on PYTHONPATH):
#   bash scripts/gpu_profile_serve.sh            -> $OUT/profile_serve.tgz
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
FOLDER=/tmp/mistral-7b-words PORT=8013
python3 -c "import sys; from minivllm_lab.bench.word_model import write_word_model; from minivllm.models.presets import MISTRAL_7B_CONFIG; write_word_model(sys.argv[1], MISTRAL_7B_CONFIG)" "$FOLDER"
python3 -m minivllm serve "$FOLDER" --load-format dummy --max-model-len 4096 --served-model-name w3-model \
  --host 127.0.0.1 --port $PORT --log-level warning > "$OUT/server.log" 2>&1 &
server=$!
for i in $(seq 300); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break
  kill -0 $server 2>/dev/null || { echo "the server exited:"; tail -20 "$OUT/server.log"; exit 1; }; sleep 1; done
core=$(pgrep -P $server -f minivllm.engine.core | head -1)
echo "frontend $server core $core" | tee "$OUT/pids.txt"
sample() {  # pid name: cumulative CPU seconds (user+system) every 0.5 s
  while kill -0 $1 2>/dev/null; do
    echo "$(date +%s.%N) $2 $(awk '{print ($14+$15)/100}' /proc/$1/stat)"; sleep 0.5; done; }
sample $server frontend >> "$OUT/cpu.txt" & s1=$!
sample $core core >> "$OUT/cpu.txt" & s2=$!
python3 -m minivllm_lab.bench.serve --base-url http://127.0.0.1:$PORT --endpoint chat --label "minivllm (process)" \
  --request-rate inf --num-prompts 1000 --vocab-size 32000 --timeout 600 --out "$OUT/served.json" > "$OUT/bench.log" 2>&1 &
bench=$!
sample $bench client >> "$OUT/cpu.txt" & s3=$!
sleep 5
py-spy record --pid $bench --duration 8 --rate 100 --format raw --output "$OUT/client.txt" --nonblocking > "$OUT/pyspy_client.log" 2>&1 &
py-spy record --pid $server --duration 8 --rate 100 --format raw --output "$OUT/frontend.txt" --nonblocking > "$OUT/pyspy_frontend.log" 2>&1 &
py-spy record --pid $core --duration 8 --rate 100 --format raw --output "$OUT/core.txt" --nonblocking > "$OUT/pyspy_core.log" 2>&1 &
wait $bench
tail -30 "$OUT/bench.log"
kill -INT $server; sleep 5; kill -9 $server 2>/dev/null; kill $s1 $s2 $s3 2>/dev/null
(cd "$OUT" && tar czf profile_serve.tgz --exclude=profile_serve.tgz *.txt *.log *.json 2>/dev/null)
