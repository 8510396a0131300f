"""The benchmark CLI: engines side by side on W1 and W2, in one process, one table, one plot.

    python -m minivllm.bench --workload w1,w2 --ablation     # the headline run (README)
    python -m minivllm.bench --engines minivllm,hf-static    # a subset, W1
    python -m minivllm.bench --smoke --ablation              # seconds, on any machine

Engines: hf-sequential (transformers one request at a time; slow, so only the first
--sequential-requests requests of each workload), hf-static (one padded batch),
hf-continuous (transformers' own continuous batching), recompute (minivllm's model without a
KV cache), minivllm-static (contiguous cache, static batching: the foundation's engine) and
minivllm (everything on). `--ablation` adds, on the first workload, minivllm with each
optimization switched off in turn. Also batch-1 decode latency and a profile of one decode
step. Every throughput is given as a fraction of its roofline, computed from the bandwidth
and matmul rate measured in the same run.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import traceback

import torch

from ..baselines import hf_model_for
from ..llm import LLM
from ..models.loader import resolve_model
from ..utils import figures_dir
from . import roofline, runners
from .metrics import format_table, hardware_name, median, save_json
from .plots import plot_bench
from .profile import decode_step_profile, decode_step_times_ms
from .workloads import base_workload, w1, w2

ENGINES = ("hf-sequential", "hf-static", "hf-continuous", "recompute", "minivllm-static", "minivllm")
HF_ENGINES = ("hf-sequential", "hf-static", "hf-continuous")
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
}
COLUMNS = ["engine", "workload", "num_requests", "output_tokens", "wall_s", "output_tok_s", "roofline_fraction",
           "ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "num_preemptions"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m minivllm.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mistral-7b")
    p.add_argument("--workload", default="w1", help="w1, w2 or w1,w2")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--ablation", action="store_true", help="minivllm with each optimization off, on the first workload")
    p.add_argument("--sequential-requests", type=int, default=6,
                   help="requests hf-sequential runs (the first N of each workload)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--no-decode", action="store_true", help="skip batch-1 decode latency and the profile")
    p.add_argument("--out", default=None, help="JSON path (default: figures/bench_<workloads>.json; the plot beside it)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: check that everything runs")
    return p.parse_args(argv)


def free_memory():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure(rows: list[dict], engine: str, run) -> None:
    """Append run()'s row and print it at once (a run cut short still tells something). If that
    engine fails, say so in its row and go on: one baseline's failure should not throw away a
    whole GPU run."""
    try:
        row = run()
        print(f"{row['engine']}, {row['workload']}: {row['output_tok_s']:,.0f} tok/s in {row['wall_s']:.1f} s", flush=True)
        rows.append(row)
    except Exception as error:  # noqa: BLE001 - reported in the table and the JSON, not hidden
        traceback.print_exc()
        rows.append({"engine": engine, "error": f"{type(error).__name__}: {error}"})


def make_workloads(names: list[str], vocab_size: int, smoke: bool):
    if smoke:
        return [w1(vocab_size, num_requests=4, max_prompt=32, output_len=8)]
    return [{"w1": w1, "w2": w2}[name](vocab_size) for name in names]


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
    measure(rows, label, run)


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        os.environ["MINIVLLM_SMOKE"] = "1"  # results and figures go to a scratch folder
    engines = args.engines.split(",")
    unknown = set(engines) - set(ENGINES)
    names = args.workload.split(",")
    if unknown or not set(names) <= {"w1", "w2"}:
        raise SystemExit(f"choose engines from {ENGINES} and workloads from w1, w2")
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

    shape = roofline.ModelShape.from_config(cfg)
    ceilings = {}
    if device == "cuda":
        ceilings = {"bandwidth_Bps": roofline.measure_bandwidth_Bps(),
                    "matmul_flops": roofline.measure_matmul_flops(dtype=dtype)}
        for w in works:
            ceilings[f"{w.name}_roofline_tok_s"] = roofline.workload_roofline_tok_s(
                shape, [len(p) for p in w.prompts], w.max_tokens, ceilings["bandwidth_Bps"],
                ceilings["matmul_flops"], dtype_bytes=dtype.itemsize)
        ceilings["batch1_roofline_tok_s"] = roofline.roofline_tok_s(
            shape, 1, 128, ceilings["bandwidth_Bps"], ceilings["matmul_flops"], dtype.itemsize)

    rows = []
    engine_args = dict(dtype=args.dtype, gpu_memory_utilization=0.6,
                       load_format="dummy" if source.folder is None else "auto")
    for work in works:
        if "minivllm-static" in engines:
            # One static batch of every request, as transformers' padded batch: the step budget
            # must hold all the prompts at once.
            run_minivllm_engine(rows, args.model, work, engine_args, "minivllm contiguous + static",
                                **STATIC, max_num_batched_tokens=work.num_prompt_tokens)
        if "minivllm" in engines:
            run_minivllm_engine(rows, args.model, work, engine_args, "minivllm")
    if args.ablation:
        for label, options in ABLATION.items():
            run_minivllm_engine(rows, args.model, works[0], engine_args, f"minivllm, {label}", **options)

    if set(HF_ENGINES) & set(engines):
        hf = hf_model_for(source, device, dtype)
        for work in works:
            if "hf-sequential" in engines:
                first = first_requests(work, args.sequential_requests)
                measure(rows, "hf-sequential", lambda: runners.run_hf_sequential(hf, first))
            if "hf-static" in engines:
                measure(rows, "hf-static", lambda: runners.run_hf_static(hf, work))
            if "hf-continuous" in engines:
                measure(rows, "hf-continuous", lambda: runners.run_hf_continuous(hf, work))
        del hf
        free_memory()

    decode = {}
    if "recompute" in engines or not args.no_decode:
        llm = LLM(args.model, **engine_args, max_model_len=max_len_of(works[0]))
        if "recompute" in engines:
            for work in works:
                measure(rows, "recompute", lambda: runners.run_recompute(llm.llm_engine.model, work))
        if not args.no_decode:
            context = 16 if args.smoke else 128
            step_ms = median(decode_step_times_ms(llm, batch=1, context=context, steps=8 if args.smoke else 100))
            decode["batch1"] = {"context": context, "ms_per_token": step_ms, "tok_s": 1e3 / step_ms}
            if device == "cuda":
                decode["batch1"]["roofline_fraction"] = decode["batch1"]["tok_s"] / ceilings["batch1_roofline_tok_s"]
                decode["profile_batch1"] = decode_step_profile(llm, batch=1, context=context)
                decode["profile_batch60"] = decode_step_profile(llm, batch=4 if args.smoke else 60, context=160)
        del llm
        free_memory()

    for row in rows:
        limit = ceilings.get(f"{base_workload(row.get('workload', ''))}_roofline_tok_s")
        if limit and "output_tok_s" in row:
            row["roofline_fraction"] = row["output_tok_s"] / limit
    print(format_table(rows, COLUMNS))
    for row in rows:
        if "error" in row:
            print(f"{row['engine']} FAILED: {row['error']}")
    if decode:
        b1 = decode["batch1"]
        limit = f" (roofline {ceilings['batch1_roofline_tok_s']:.0f} tok/s)" if ceilings else ""
        print(f"batch-1 decode: {b1['ms_per_token']:.2f} ms/token = {b1['tok_s']:.1f} tok/s{limit}")
        for key in ("profile_batch1", "profile_batch60"):
            if key in decode:
                p = decode[key]
                print(f"decode step at batch {p['batch']}: wall {p['wall_ms']:.2f} ms, GPU kernels {p['gpu_ms']:.2f} ms,"
                      f" overhead {p['overhead_ms']:.2f} ms ({100 * p['overhead_fraction']:.0f}%),"
                      f" {p['kernels_per_step']:.0f} kernels and {p['host_launches_per_step']:.0f} launches per step")
    out = args.out or figures_dir() / f"bench_{'_'.join(w.name.lower() for w in works)}.json"
    result = {"model": args.model, "dtype": args.dtype, "hardware": hardware_name(),
              "workloads": [w.name for w in works], "ceilings": ceilings, "rows": rows, "decode": decode}
    save_json(out, result)
    plot = plot_bench(result, str(out).removesuffix(".json") + ".png")
    print(f"results: {out}, plot: {plot}")


if __name__ == "__main__":
    main()
