#!/usr/bin/env bash
# Does every notebook run to the end on a Colab T4? Reproduced on a bigger GPU: each notebook runs under
# MINIVLLM_PROFILE=t4 (minivllm_lab.notebook.setup: a 15 GiB memory cap for the process, fp16, the T4's kernel
# settings and model). Capped at 15 GiB each, $T4_PARALLEL notebooks share the GPU at a time: the check
# is pass or fail, not speed. The executed copies and their figures are thrown away; the result is
# figures/colab_t4_check.json ({"profile", "hardware", "commit", "notebooks": {name: "passed" | "failed: why"}},
# and "earlier": the last check, at an older commit, of a notebook not yet checked at this one),
# also copied to $OUT with the logs. A run at the same commit as the file adds to it; a run at a new commit
# moves the file's checks to "earlier".
# Usage (repo root, after scripts/gpu_parts.sh): MINIVLLM_COMMIT=<the commit copied> bash scripts/gpu_t4_check.sh notebooks/*.ipynb
# $NB_TIMEOUT_S (default 1200) bounds a cell. nbclient can sit on the cell after an ipywidgets `interact` until
# that bound, then go on (jupyter/nbclient#312; seen in 02 on the GPU machine): keep it short enough for one call.
OUT=${OUT:-gpu-out}; mkdir -p "$OUT/t4-logs"
source scripts/gpu_parts.sh env
export MINIVLLM_SMOKE=0 MINIVLLM_PROFILE=t4 MINIVLLM_FIGURES=/tmp/t4-figures OMP_NUM_THREADS=2
check_one() {   # runs a copy of the notebook, so the committed one keeps its outputs
  local nb=$1 name; name=$(basename "$nb" .ipynb)
  local copy; copy="$(dirname "$nb")/t4check_$name.ipynb"; cp "$nb" "$copy"   # same folder: same working directory
  local start=$SECONDS
  python3 -m pytest -q -p no:cacheprovider --nbmake --nbmake-timeout="${NB_TIMEOUT_S:-1200}" "$copy" > "$OUT/t4-logs/$name.log" 2>&1
  echo "$? $((SECONDS - start))" > "$OUT/t4-logs/$name.rc"; rm -f "$copy"
}
export -f check_one; export OUT
printf '%s\n' "$@" | xargs -P "${T4_PARALLEL:-7}" -I{} bash -c 'check_one {}'
python3 - "$@" <<'PY'
import json, pathlib, re, subprocess, sys, torch
out = pathlib.Path(__import__("os").environ["OUT"])
result = {"profile": "t4: 15 GiB cap, fp16, T4 kernel settings, Llama-3.2-1B shape (minivllm_lab.notebook.setup)",
          "hardware": torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU",
          "commit": __import__("os").environ.get("MINIVLLM_COMMIT") or subprocess.run(
              ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
          "notebooks": {}, "seconds": {},
          "note": "seconds: wall time with several notebooks sharing the GPU at once, not a T4's speed"}
for nb in sys.argv[1:]:
    name = pathlib.Path(nb).stem
    rc, seconds = (out / "t4-logs" / f"{name}.rc").read_text().split()
    log = (out / "t4-logs" / f"{name}.log").read_text()
    log = re.sub(r"\x1b\[[0-9;]*m", "", log)  # the traceback's colours
    failed = [l.split(" - ", 1)[-1] for l in log.splitlines() if l.startswith("FAILED ")]
    raised = [l.strip() for l in log.splitlines() if re.match(r"^\w*(Error|Exception): ", l.strip())]
    why = next((w for w in [*(f for f in failed[-1:] if f.strip()), *raised[-1:]] if w),
               (log.strip().splitlines() or ["no output"])[-1])
    result["notebooks"][name] = "passed" if rc == "0" else f"failed: {why[:300]}"
    result["seconds"][name] = int(seconds)
previous = pathlib.Path("figures/colab_t4_check.json")
if previous.exists():
    earlier = json.loads(previous.read_text())
    if earlier.get("commit") == result["commit"]:  # the same commit checked in parts (calls of 10 minutes): one file
        result["notebooks"] = earlier["notebooks"] | result["notebooks"]
        result["seconds"] = earlier.get("seconds", {}) | result["seconds"]
        older = earlier.get("earlier", {})
    else:  # a new commit: the previous file's checks become each notebook's last check at an older commit
        older = earlier.get("earlier", {}) | {
            name: {"result": r, "commit": earlier.get("commit"), "seconds": earlier.get("seconds", {}).get(name)}
            for name, r in earlier["notebooks"].items()}
    # a notebook not yet checked at this commit keeps its last check at an older one, until it is
    older = {name: check for name, check in older.items() if name not in result["notebooks"]}
    if older:
        result["earlier"] = dict(sorted(older.items()))
result["notebooks"] = dict(sorted(result["notebooks"].items()))
result["seconds"] = dict(sorted(result["seconds"].items()))
text = json.dumps(result, indent=1)
pathlib.Path("figures/colab_t4_check.json").write_text(text + "\n")
(out / "colab_t4_check.json").write_text(text + "\n")
print(text)
PY
tar czf "$OUT/t4-logs.tgz" -C "$OUT" t4-logs && rm -rf "$OUT/t4-logs"
