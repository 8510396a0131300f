#!/usr/bin/env bash
# Execute notebooks on the GPU machine so the committed copies carry real outputs.
# Usage (repo root, .whl carried): bash scripts/gpu_notebooks.sh notebooks/00_*.ipynb notebooks/01_*.ipynb
# Everything comes back as one tarball in $OUT (the device returns at most 8 files).
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH \
  && python3 -m ipykernel install --user --name python3 >/dev/null || exit 1
export MINIVLLM_SMOKE=0 PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider --nbmake --nbmake-timeout=1200 --overwrite --durations=0 "$@" 2>&1 | tee "$OUT/notebooks.log"
tar czf "$OUT/executed.tgz" "$@" figures
