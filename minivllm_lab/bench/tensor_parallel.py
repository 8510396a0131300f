"""Tensor parallelism measured: at each tensor-parallel size, in one run, batch-1 decode latency,
W2 throughput, and what the all-reduces cost.

    python -m minivllm_lab.bench.tensor_parallel --sizes 1,2       # the Mistral-7B shape on 1 and 2 GPUs
    python -m minivllm_lab.bench.tensor_parallel --smoke           # seconds: SmolLM2 on CPU processes (gloo)

On a GPU the model is the Mistral-7B shape with dummy weights (the speed does not depend on their
values); on a CPU, the real SmolLM2-135M (9 query heads and 3 KV heads: sizes 1 and 3 divide them).

What each number is:
- batch-1 decode: median and p90 wall time of a decode step of one sequence (`decode_step_times_ms`);
- W2: nano-vllm's offline workload (scaled by --w2-requests), output tokens per second;
- all-reduce: median time of one all-reduce of a batch-1 activation ([1, hidden] in the model's dtype),
  timed alone (every rank makes the same calls; rank 0's times, which include the ranks' skew), and its
  share of the batch-1 step: 2 per layer and 1 for the embedding.
  Timed alone, it is what one collective costs; inside a step it may overlap or queue differently.
Bytes: every all-reduce carries hidden x dtype bytes per token, 2 per layer + 1 (the embedding), and
the logits' all-gather vocab x dtype bytes per sampled token: `communication_bytes_per_token`.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from minivllm.config import DTYPE_NAMES
from minivllm.llm import LLM
from minivllm.models.loader import resolve_model

from ..machine import free_memory
from . import runners
from .metrics import format_table, hardware_name, median, percentile, save_json
from .profile import decode_step_times_ms, time_all_reduce
from .workloads import w2


def communication_bytes_per_token(cfg, dtype_bytes: int) -> dict:
    """Bytes each collective of a forward carries per token (the same at every tensor-parallel size)."""
    all_reduce = (2 * cfg.num_layers + 1) * cfg.hidden_size * dtype_bytes
    return {"all_reduce": all_reduce, "all_reduces": 2 * cfg.num_layers + 1,
            "logits_all_gather": cfg.vocab_size * dtype_bytes}


def ring_bytes_sent_per_rank(nbytes: int, tp: int) -> float:
    """A ring all-reduce of `nbytes` sends 2 (N - 1) / N of them from each of the N ranks."""
    return 2 * (tp - 1) / tp * nbytes


def measure_size(model: str, tp: int, engine_args: dict, context: int, steps: int, work) -> dict:
    """One engine at tensor-parallel size `tp`: its row of the table."""
    threads = torch.get_num_threads()
    if torch.device(engine_args["device"]).type == "cpu":
        # The same cores at every size: N ranks share them (each worker takes cores / N too).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))
    llm = LLM(model, tensor_parallel_size=tp, **engine_args)
    try:
        cfg = llm.llm_engine.model_config
        times = decode_step_times_ms(llm, batch=1, context=context, steps=steps)
        row = {"tp": tp, "batch1_ms": median(times), "batch1_p90_ms": percentile(times, 90)}
        row["batch1_tok_s"] = 1e3 / row["batch1_ms"]
        if tp > 1:
            reduce_ms = median(llm.llm_engine.executor.collective_rpc(time_all_reduce, 1))
            row["all_reduce_ms"] = reduce_ms
            row["all_reduce_share"] = (2 * cfg.num_layers + 1) * reduce_ms / row["batch1_ms"]
        w2_stats = runners.run_minivllm(llm, work, engine=f"minivllm tp={tp}")
        row["w2_tok_s"] = w2_stats["output_tok_s"]
        return row
    finally:
        llm.shutdown()
        del llm
        free_memory()
        torch.set_num_threads(threads)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m minivllm_lab.bench.tensor_parallel", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="default: mistral-7b (dummy weights) on a GPU, smollm2-135m on CPU")
    p.add_argument("--sizes", default=None, help="tensor-parallel sizes, comma-separated (default: 1,2 / CPU 1,3)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on a CPU")
    p.add_argument("--context", type=int, default=None, help="batch-1 decode context (default 1024 / CPU 64)")
    p.add_argument("--steps", type=int, default=50, help="timed batch-1 decode steps")
    p.add_argument("--w2-requests", type=int, default=None, help="W2's size (default 256 / CPU 8)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="of each GPU, as LLM's keyword")
    p.add_argument("--gpu-memory-limit-bytes", type=int, default=None,
                   help="each GPU taken to have this much memory, as LLM's keyword (the T4 profile: 15 GiB)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: check that everything runs")
    p.add_argument("--out", default="bench-results/tensor_parallel.json")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = torch.device(device).type == "cuda"
    model = args.model or ("mistral-7b" if on_gpu else "smollm2-135m")
    sizes = [int(s) for s in (args.sizes or ("1,2" if on_gpu else "1,3")).split(",")]
    dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    context = args.context or (8 if args.smoke else 1024 if on_gpu else 64)
    steps = 3 if args.smoke else args.steps
    num_requests = args.w2_requests or (2 if args.smoke else 256 if on_gpu else 8)
    cfg = resolve_model(model).config
    lengths = dict(min_len=8, max_len=32) if args.smoke or not on_gpu else {}
    work = w2(cfg.vocab_size, num_requests=num_requests, **lengths)
    max_len = max(len(p) + n for p, n in zip(work.prompts, work.max_tokens))
    engine_args = dict(device=device, dtype=dtype, max_model_len=max(max_len, context + steps + 8) + 16,
                       max_num_seqs=min(256, num_requests), enforce_eager=args.enforce_eager)
    if on_gpu:
        engine_args["gpu_memory_utilization"] = args.gpu_memory_utilization
        engine_args["gpu_memory_limit_bytes"] = args.gpu_memory_limit_bytes
    if on_gpu and model == "mistral-7b":
        engine_args["load_format"] = "dummy"
    if not on_gpu:
        engine_args["num_kv_blocks"] = 256

    rows = [measure_size(model, tp, engine_args, context, steps, work) for tp in sizes]
    base = rows[0]
    for row in rows:
        row["batch1_speedup"] = base["batch1_ms"] / row["batch1_ms"]
        row["w2_speedup"] = row["w2_tok_s"] / base["w2_tok_s"]
        row["ideal_speedup"] = row["tp"] / base["tp"]
    comm = communication_bytes_per_token(cfg, DTYPE_NAMES[dtype].itemsize)
    result = {"hardware": hardware_name() if on_gpu else f"CPU, {os.cpu_count()} cores (gloo)",
              "gpus_visible": torch.cuda.device_count(), "model": model, "dtype": dtype,
              "batch1_context": context, "w2_requests": num_requests, "bytes_per_token": comm, "rows": rows}
    print(f"{model} ({dtype}) on {result['hardware']}")
    print(format_table(rows, ["tp", "batch1_ms", "batch1_p90_ms", "batch1_speedup", "ideal_speedup",
                              "all_reduce_ms", "all_reduce_share", "w2_tok_s", "w2_speedup"]))
    print(f"all-reduces per token: {comm['all_reduces']} x {cfg.hidden_size} values = {comm['all_reduce']:,} bytes; "
          f"logits all-gather {comm['logits_all_gather']:,} bytes per sampled token")
    save_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
