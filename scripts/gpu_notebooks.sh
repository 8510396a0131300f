#!/usr/bin/env bash
# Execute notebooks on the GPU machine so the committed copies carry real outputs.
# Usage (repo root, after scripts/gpu_parts.sh unpack1, unpack2 and unpack3): MINIVLLM_COMMIT=<the commit copied> bash scripts/gpu_notebooks.sh notebooks/00_*.ipynb ...
# (the machine gets a copy of the working tree whose .git may be older: MINIVLLM_COMMIT names the commit it is)
# (and MINIVLLM_DIRTY=1 if that copy had uncommitted changes under minivllm/, minivllm_lab/ or notebooks/, else 0)
# Notebooks run one at a time; none is started after $NB_START_BEFORE_S seconds (default: no limit),
# so a call that must end in 10 minutes still brings back what finished. Everything comes back as
# one tarball in $OUT (the device returns at most 8 files), rewritten after each notebook: the notebooks that
# passed and the figures this call wrote (a later call's copy of the tree has the older figures).
# A notebook still running after $NB_DUMP_AFTER_S seconds (default 300) gets its kernel's Python stacks written to
# $OUT/stacks.log (py-spy dump, once a minute), so a call cut short still says where it was; a cell that runs
# longer than $NB_TIMEOUT_S seconds (default 1200) fails its notebook, so one that hangs leaves time to the next.
# nbclient can wait out that whole bound after a cell that shows an ipywidgets `interact`, then carry on without an
# error (jupyter/nbclient#312): 02 waited 240 s of NB_TIMEOUT_S=240 so on 2026-12-07; its cells took 78 s.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
source scripts/gpu_parts.sh env   # the wheels were installed by `source scripts/gpu_parts.sh unpack1`
export MINIVLLM_SMOKE=0 PYTHONUNBUFFERED=1 MINIVLLM_REFERENCE_RUN=1  # this run makes the committed outputs: no older run beside it
done_nbs=(); started=$(mktemp); sleep 1
for nb in "$@"; do
  if [ -n "$NB_START_BEFORE_S" ] && [ "$SECONDS" -ge "$NB_START_BEFORE_S" ]; then
    echo "skipped $nb: started too late ($SECONDS s)" | tee -a "$OUT/notebooks.log"; continue
  fi
  # Its output goes to the file, never to this script's stdout: a `sleep` left behind by the kill below must not
  # hold the caller's pipe open.
  ( sleep "${NB_DUMP_AFTER_S:-300}"; while true; do
      for pid in $(pgrep -f ipykernel_launcher); do
        echo "### $nb at $SECONDS s, kernel $pid"; py-spy dump --pid "$pid"; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
      done; sleep 60; done ) >> "$OUT/stacks.log" 2>&1 & watchdog=$!
  python3 -m pytest -q -p no:cacheprovider --nbmake --nbmake-timeout="${NB_TIMEOUT_S:-1200}" --overwrite --durations=0 "$nb" 2>&1 \
    | tee -a "$OUT/notebooks.log" && done_nbs+=("$nb")
  kill "$watchdog" 2>/dev/null
  echo "$nb finished at $SECONDS s" | tee -a "$OUT/notebooks.log"
  mapfile -t written < <(find figures -type f -newer "$started")
  tar czf "$OUT/executed.tgz" "${done_nbs[@]}" "${written[@]}"
done
