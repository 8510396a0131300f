#!/usr/bin/env bash
# Issues 31 and 32's GPU measurements in one background run on one NVIDIA H200 (about 20 minutes: more than one
# call may run), from a copy of the tree in /tmp, so the calls that follow only watch it. Calls made back to back
# (the machine keeps /tmp only while it is warm, about 30 s after a call):
#   call 1 (carry .gpu1):  source scripts/gpu_parts.sh unpack1 \
#                          && MINIVLLM_COMMIT=<commit> bash scripts/gpu_measure_all.sh start && sleep 540
#   calls 2, 3:            sleep 540; bash scripts/gpu_measure_all.sh progress
#   any call:              bash scripts/gpu_measure_all.sh collect   # what is written so far -> $OUT/measure_all.tgz
# The parts, most needed first, each writing its JSON and log: the mixed step (mixed_step_h200.json), the default
# server's capacity with W3 offline (serving_capacity_h200.json), quantization (17_quantization.json), the
# weight-only kernel's launch settings (w8_sweep_h200.json), the GPU tests, W3 offline's profile.
set -o pipefail
HERE=/tmp/measure_all
case "$1" in
  start)
    [ -n "${MINIVLLM_COMMIT:-}" ] || { echo "set MINIVLLM_COMMIT to the commit copied"; exit 2; }
    rm -rf "$HERE" && mkdir -p "$HERE/out" && cp -r . "$HERE/repo" && rm -rf "$HERE"/repo/.gpu[123]
    cd "$HERE/repo" || exit 1
    export MINIVLLM_SMOKE=0 MINIVLLM_DIRTY=0 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD O=$HERE/out
    setsid nohup bash -c '
      part() { echo "$(date -u +%T) $1"; local log=$O/$1.log; shift; "$@" > "$log" 2>&1; }
      part mixed_step python3 -m minivllm_lab.bench.mixed_step --out $O/mixed_step_h200.json
      part capacity python3 scripts/serving_capacity.py --out $O/serving_capacity_h200.json
      part quantization python3 -m minivllm_lab.bench.quantization --out $O/17_quantization.json
      part w8_sweep python3 scripts/w8_sweep.py --out $O/w8_sweep_h200.json
      part gpu_tests python3 -m pytest -q -m gpu tests/test_gpu.py tests/test_cuda_graphs.py \
        tests/test_mixed_graphs.py tests/test_gpu_quantization.py
      part w3_profile python3 scripts/w3_offline_profile.py --out $O/w3_offline_profile_h200.json
      echo "$(date -u +%T) done"' > "$HERE/out/parts.log" 2>&1 < /dev/null &
    echo "started: $HERE/out/parts.log" ;;
  progress)
    cat "$HERE/out/parts.log"; for f in "$HERE"/out/*.log; do echo "== $f"; tail -n 3 "$f"; done ;;
  collect)
    (cd "$HERE/out" && tar czf "${OUT:-/tmp}/measure_all.tgz" ./*.log $(ls ./*.json 2>/dev/null)) \
      && cat "$HERE/out/parts.log" ;;
  *) echo "usage: bash scripts/gpu_measure_all.sh start|progress|collect"; exit 2 ;;
esac
