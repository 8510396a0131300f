#!/usr/bin/env bash
# The CPU path before and after the torch reference's CPU fix (SDPA's enable_gqa instead of a copied KV
# head per query head, one index_select for the paged gather), on W1 at full size: the full engine against
# contiguous static batching, at each commit, one after the other on this machine (no other job running).
#
#   bash scripts/cpu_path_ab.sh [commit before the fix]     # default 1ced6d8
#
# Writes bench-results/cpu_path_before.json and cpu_path_after.json (the bench CLI's JSON and plot).
set -euo pipefail
BEFORE=${1:-1ced6d8}
ROOT=$(git rev-parse --show-toplevel)
OUT=${OUT:-$ROOT/bench-results}
tmp=$(mktemp -d)
git -C "$ROOT" worktree add -q --detach "$tmp/before" "$BEFORE"
trap 'git -C "$ROOT" worktree remove --force "$tmp/before"' EXIT
for side in before after; do
  dir=$ROOT
  [ "$side" = before ] && dir=$tmp/before
  echo "== $side: $(git -C "$dir" log -1 --format='%h %s')"
  (cd "$dir" && PYTHONPATH=$dir python -m minivllm_lab.bench --engines minivllm-static,minivllm --no-decode \
     --out "$OUT/cpu_path_$side.json")
done
