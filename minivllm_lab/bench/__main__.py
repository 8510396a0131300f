"""The benchmark CLI: engines side by side on W1, W2 and W3-offline, in one process, one table, one plot.

    python -m minivllm_lab.bench --workload w1,w2,w3-offline --ablation   # every workload and the ablation
    python -m minivllm_lab.bench --engines minivllm,hf-static              # a subset, W1
    python -m minivllm_lab.bench --smoke --ablation                        # seconds, on any machine

The model follows the device: Mistral-7B's shape with dummy weights on a GPU, the real SmolLM2-135M
on a CPU (--model chooses another). Results go to bench-results/ under the current directory (--out
chooses another file), never to the repository's figures/, which holds the GPU runs the README cites.

Workloads: W1 and W2 (see workloads.py), and W3-offline: the serving benchmark's 1000 requests
submitted all at once, one offline generate.

Engines: hf-sequential (transformers one request at a time; slow, so only the first
--sequential-requests requests of each workload), hf-static (one padded batch),
hf-continuous (transformers' own continuous batching), recompute (minivllm's model without a
KV cache), minivllm-static (contiguous cache, static batching: the first engine the notebooks build) and
minivllm (everything on). hf-sequential, hf-static and recompute generate one length for every
request, so they skip W2. `--ablation` adds, on the first workload, minivllm with each
optimization switched off in turn. Also batch-1 decode latency and, on a GPU, a profile of one
decode step (and of a W2-shaped one when W2 is among the workloads). Every throughput is given as
a fraction of its roofline, computed from the bandwidth and matmul rate measured in the same run.

An engine that fails leaves an error in its row; the CLI still prints the table and writes the
JSON, then exits with status 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from pathlib import Path

import torch

from minivllm.llm import LLM
from minivllm.models.loader import resolve_model
from minivllm.utils import plural

from ..baselines import hf_model_for
from ..machine import default_model, free_memory
from . import roofline, runners
from .metrics import format_seconds, format_table, hardware_name, median, save_json
from .plots import plot_bench
from .profile import decode_step_profile, decode_step_times_ms
from .workloads import base_workload, w1, w2, w3_offline

ENGINES = ("hf-sequential", "hf-static", "hf-continuous", "recompute", "minivllm-static", "minivllm")
HF_ENGINES = ("hf-sequential", "hf-static", "hf-continuous")
# Baselines that generate the same number of tokens for every request (W2's lengths differ).
SAME_LENGTH_ENGINES = ("hf-sequential", "hf-static", "recompute")
WORKLOADS = {"w1": w1, "w2": w2, "w3-offline": w3_offline}
# --smoke: every workload at a size that runs in seconds on a CPU, built by the same code.
SMOKE_SIZES = {
    "w1": dict(num_requests=4, max_prompt=32, output_len=8),
    "w2": dict(num_requests=4, min_len=8, max_len=32),
    "w3-offline": dict(num_requests=4, system_len=8, min_user=4, max_user=8, output_len=4),
}
# Tokens each profiled request may grow by: it decodes while the rest of its batch is prefilled
# (256 x 1024 tokens for the W2-shaped step: 32 steps of 8192 tokens), then for a warm-up step
# and the 10 timed ones. A request that reached max_model_len would leave the timed steps short.
DECODE_ROOM = 64
STATIC = dict(enable_paged_kv=False, enable_continuous_batching=False, enable_chunked_prefill=False,
              enable_prefix_caching=False)
# Everything on, then one optimization off at a time.
ABLATION = {
    "no paged KV (contiguous)": dict(enable_paged_kv=False),
    "no continuous batching": dict(enable_continuous_batching=False),
    "no chunked prefill": dict(enable_chunked_prefill=False),
    "no prefix caching": dict(enable_prefix_caching=False),
    "no Triton kernels (torch attention)": dict(attention_backend="torch"),
    "no CUDA graphs (eager)": dict(enforce_eager=True),
    "no overlap (async_scheduling=False)": dict(async_scheduling=False),
}
COLUMNS = ["engine", "workload", "num_requests", "output_tokens", "wall_s", "output_tok_s", "roofline_fraction",
           "ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "num_preemptions"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m minivllm_lab.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None,
                   help="a preset, folder or hub id. Default: mistral-7b (Mistral-7B's shape, dummy weights) on "
                        "a GPU; smollm2-135m (real weights, works offline) on a CPU, where the Mistral shape would "
                        "take 29 GB in float32; $MINIVLLM_MODEL overrides both")
    p.add_argument("--workload", default="w1", help=f"one or more of {', '.join(WORKLOADS)}, comma-separated")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--ablation", action="store_true", help="minivllm with each optimization off, on the first workload")
    p.add_argument("--sequential-requests", type=int, default=6,
                   help="requests hf-sequential runs (the first N of each workload)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--no-decode", action="store_true", help="skip batch-1 decode latency and the profiles")
    p.add_argument("--out", default=None,
                   help="JSON path (default: bench-results/bench_<workloads>.json in the current directory, "
                        "smoke_bench_<workloads>.json with --smoke; the plot beside it)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: check that everything runs")
    args = p.parse_args(argv)
    args.model = args.model or default_model()
    return args


def default_out(names: list[str], smoke: bool) -> Path:
    # A smoke run has its own file name: it must not overwrite a real run's results.
    return Path("bench-results") / f"{'smoke_' if smoke else ''}bench_{'_'.join(names)}.json"


def measure(rows: list[dict], engine: str, workload: str, run) -> None:
    """Append run()'s row and print it at once (a run cut short still tells something). If that
    engine fails, say so in its row and go on: one baseline's failure should not throw away a
    whole GPU run."""
    try:
        row = run()
        print(f"{row['engine']}, {row['workload']}: {row['output_tok_s']:,.0f} tok/s in "
              f"{format_seconds(row['wall_s'])}", flush=True)
        rows.append(row)
    except Exception as error:  # noqa: BLE001 - reported in the table and the JSON, not hidden
        traceback.print_exc()
        rows.append({"engine": engine, "workload": workload, "error": f"{type(error).__name__}: {error}"})
    # The failed engine's memory was held by the exception's frames until here: free it before the next one.
    free_memory()


def make_workloads(names: list[str], vocab_size: int, smoke: bool):
    return [WORKLOADS[name](vocab_size, **(SMOKE_SIZES[name] if smoke else {})) for name in names]


def engines_for(work, engines: list[str]) -> list[str]:
    """The chosen engines that can run this workload (a baseline that can't is skipped, not failed)."""
    if len(set(work.max_tokens)) == 1:
        return engines
    skipped = [e for e in engines if e in SAME_LENGTH_ENGINES]
    if skipped:
        print(f"{work.name}: skipping {', '.join(skipped)} (they generate one length for every request)")
    return [e for e in engines if e not in SAME_LENGTH_ENGINES]


def first_requests(work, n: int):
    n = min(n, len(work.prompts))
    return dataclasses.replace(work, name=f"{work.name} (first {n})", prompts=work.prompts[:n],
                               max_tokens=work.max_tokens[:n])


def max_len_of(work) -> int:
    return max(len(p) + n for p, n in zip(work.prompts, work.max_tokens))


def run_minivllm_engine(rows, model: str, work, engine_args: dict, label: str, **options) -> None:
    def run():
        # max_num_seqs no larger than the workload: fewer CUDA graphs to capture, same schedule.
        llm = LLM(model, **engine_args, max_model_len=max_len_of(work), max_num_seqs=min(256, len(work.prompts)),
                  **options)
        try:
            return runners.run_minivllm(llm, work, engine=label)
        finally:
            del llm
            free_memory()
    measure(rows, label, work.name, run)


def measure_decode(llm, decode: dict, context: int, steps: int, profiles: dict, ceilings: dict) -> None:
    """Batch-1 decode latency at `context` tokens, then each profile (key -> (batch, context)),
    written into `decode` as they come, so that a failure keeps what was measured before it."""
    step_ms = median(decode_step_times_ms(llm, batch=1, context=context, steps=steps))
    decode["batch1"] = {"context": context, "ms_per_token": step_ms, "tok_s": 1e3 / step_ms}
    if ceilings:
        decode["batch1"]["roofline_fraction"] = decode["batch1"]["tok_s"] / ceilings["batch1_roofline_tok_s"]
    for key, (batch, profile_context) in profiles.items():
        decode[key] = decode_step_profile(llm, batch=batch, context=profile_context)


def print_decode(decode: dict, ceilings: dict) -> None:
    if "batch1" in decode:
        b1 = decode["batch1"]
        limit = f" (roofline {ceilings['batch1_roofline_tok_s']:.0f} tok/s)" if ceilings else ""
        print(f"batch-1 decode: {b1['ms_per_token']:.2f} ms/token = {b1['tok_s']:.1f} tok/s{limit}")
    for key, name in (("profile_batch1", "decode step"), ("profile_batch60", "decode step"),
                      ("profile_w2", "W2 decode step")):
        if key in decode:
            p = decode[key]
            # overhead = wall time with no GPU kernel running: the CPU's share of the step.
            print(f"{name} (batch {p['batch']} x {p['context']}): wall {p['wall_ms']:.2f} ms, GPU kernels "
                  f"{p['gpu_ms']:.2f} ms, overhead {p['overhead_ms']:.2f} ms ({100 * p['overhead_fraction']:.0f}%),"
                  f" {plural(round(p['kernels_per_step']), 'kernel')} and "
                  f"{plural(round(p['host_launches_per_step']), 'launch', 'launches')} per step")


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        os.environ["MINIVLLM_SMOKE"] = "1"  # progress bars stay quiet
    engines = args.engines.split(",")
    names = args.workload.split(",")
    if set(engines) - set(ENGINES) or set(names) - set(WORKLOADS):
        raise SystemExit(f"choose engines from {', '.join(ENGINES)} and workloads from {', '.join(WORKLOADS)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    if device == "cpu":
        args.dtype, dtype = "float32", torch.float32  # CPUs are slow and inexact in half precision
    source = resolve_model(args.model)
    cfg = source.config
    works = make_workloads(names, cfg.vocab_size, args.smoke)
    print(f"{hardware_name()} | {args.model} ({'dummy weights' if source.folder is None else 'real weights'}), "
          f"{args.dtype} | " + "; ".join(f"{w.name}: {len(w.prompts)} requests, {w.num_output_tokens} output tokens"
                                         for w in works))
    chosen = {w.name: engines_for(w, engines) for w in works}
    wanted = set().union(*chosen.values())

    shape = roofline.ModelShape.from_config(cfg)
    ceilings = {}
    if device == "cuda":
        ceilings = {"bandwidth_Bps": roofline.measure_bandwidth_Bps(),
                    "matmul_flops": roofline.measure_matmul_flops(dtype=dtype)}
        for w in works:
            # Keyed by the name base_workload gives, which is how rows find their roofline.
            ceilings[f"{base_workload(w.name)}_roofline_tok_s"] = roofline.workload_roofline_tok_s(
                shape, [len(p) for p in w.prompts], w.max_tokens, ceilings["bandwidth_Bps"],
                ceilings["matmul_flops"], dtype_bytes=dtype.itemsize)
        ceilings["batch1_roofline_tok_s"] = roofline.roofline_tok_s(
            shape, 1, 128, ceilings["bandwidth_Bps"], ceilings["matmul_flops"], dtype.itemsize)

    rows = []
    engine_args = dict(dtype=args.dtype, gpu_memory_utilization=0.6,
                       load_format="dummy" if source.folder is None else "auto")
    for work in works:
        if "minivllm-static" in chosen[work.name]:
            # One static batch of every request, as transformers' padded batch: the step budget
            # must hold all the prompts at once.
            run_minivllm_engine(rows, args.model, work, engine_args, "minivllm contiguous + static",
                                **STATIC, max_num_batched_tokens=work.num_prompt_tokens)
        if "minivllm" in chosen[work.name]:
            run_minivllm_engine(rows, args.model, work, engine_args, "minivllm")
    if args.ablation:
        for label, options in ABLATION.items():
            run_minivllm_engine(rows, args.model, works[0], engine_args, f"minivllm, {label}", **options)

    if set(HF_ENGINES) & wanted:
        hf = hf_model_for(source, device, dtype)
        for work in works:
            if "hf-sequential" in chosen[work.name]:
                first = first_requests(work, args.sequential_requests)
                measure(rows, "hf-sequential", first.name, lambda: runners.run_hf_sequential(hf, first))
            if "hf-static" in chosen[work.name]:
                measure(rows, "hf-static", work.name, lambda: runners.run_hf_static(hf, work))
            if "hf-continuous" in chosen[work.name]:
                measure(rows, "hf-continuous", work.name, lambda: runners.run_hf_continuous(hf, work))
        del hf
        free_memory()

    decode = {}
    batch1_context = 16 if args.smoke else 128
    profiles = {}  # key -> (batch, context) of a decode step to profile: CUDA only
    if device == "cuda" and not args.no_decode:
        profiles = {"profile_batch1": (1, batch1_context), "profile_batch60": (4 if args.smoke else 60, 160)}
        if "w2" in names:
            profiles["profile_w2"] = (4, 16) if args.smoke else (256, 1024)
    if "recompute" in wanted or not args.no_decode:
        # Long enough for the first workload and for every profiled context; max_num_seqs for the
        # W2-shaped step's whole batch.
        max_model_len = max([max_len_of(works[0])] + [context + DECODE_ROOM for _, context in profiles.values()])
        llm = LLM(args.model, **engine_args, max_model_len=max_model_len, max_num_seqs=256)
        for work in works:
            if "recompute" in chosen[work.name]:
                measure(rows, "recompute", work.name, lambda: runners.run_recompute(llm.llm_engine.model, work))
        if not args.no_decode:
            try:
                measure_decode(llm, decode, batch1_context, 8 if args.smoke else 100, profiles, ceilings)
            except Exception as error:  # noqa: BLE001 - as measure(): kept in the JSON, the run goes on
                traceback.print_exc()
                decode["error"] = f"{type(error).__name__}: {error}"
        del llm
        free_memory()

    for row in rows:
        limit = ceilings.get(f"{base_workload(row['workload'])}_roofline_tok_s")
        if limit and "output_tok_s" in row:
            row["roofline_fraction"] = row["output_tok_s"] / limit
    print(format_table(rows, COLUMNS))
    print_decode(decode, ceilings)
    failures = {f"{row['engine']} on {row['workload']}": row["error"] for row in rows if "error" in row}
    if "error" in decode:
        failures["decode"] = decode["error"]
    for what, error in failures.items():
        print(f"{what} FAILED: {error}")
    out = Path(args.out) if args.out else default_out(names, args.smoke)
    result = {"model": args.model, "dtype": args.dtype, "hardware": hardware_name(),
              "workloads": [w.name for w in works], "ceilings": ceilings, "rows": rows, "decode": decode}
    save_json(out, result)
    plot = plot_bench(result, str(out).removesuffix(".json") + ".png")
    print(f"results: {out}, plot: {plot}")
    if failures:  # after saving: what did run is kept, and a script or CI still sees the failure
        print(f"failed: {'; '.join(failures)} (everything else is saved in {out})", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
