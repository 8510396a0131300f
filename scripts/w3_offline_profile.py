"""Where W3-offline's time goes (Mistral-7B's shape, bf16, dummy weights, `LLM` with default arguments; a GPU).

    python scripts/w3_offline_profile.py --out OUT.json

Run 1 times every engine step of `LLM.generate` on W3-offline (1000 requests at once) and groups the steps by
what they carried: decode-only steps, steps with prompt tokens up to the largest mixed CUDA graph, and larger
ones (eager). Run 2, on fresh prompts, runs the same workload under torch.profiler and sums the GPU's time per
kernel, so that the decode steps' time can be set against their matmuls' FLOPs and their attention's bytes.
"""
from __future__ import annotations

import argparse
import collections
import json
import time

import torch

from minivllm import LLM, SamplingParams
from minivllm.worker.cuda_graphs import MAX_MIXED_GRAPH_TOKENS
from minivllm_lab.bench.metrics import hardware_name, source_commit
from minivllm_lab.bench.profile import profiler
from minivllm_lab.bench.workloads import w3


def kind_of(num_tokens: int, num_seqs: int) -> str:
    if num_tokens == num_seqs:
        return "decode only"
    return "with prompt tokens, graphed size" if num_tokens <= MAX_MIXED_GRAPH_TOKENS else "with prompt tokens, eager"


def timed_run(llm, seed: int, num_requests: int) -> dict:
    """`LLM.generate` on W3-offline, each engine step's wall time grouped by the kind of step launched in it
    (with async scheduling a step's call launches step n+1 and waits for step n: the launched step names it)."""
    engine, core = llm.llm_engine, llm.llm_engine.engine_core
    schedule, step, launched, steps = core.scheduler.schedule, engine.step, [], []

    def recording_schedule():
        out = schedule()
        if out:
            launched.append((sum(out.num_new_tokens), len(out.entries)))
        return out

    def timed_step():
        t0, n_before = time.perf_counter(), len(launched)
        outputs = step()
        steps.append((time.perf_counter() - t0, launched[n_before:]))
        return outputs

    core.scheduler.schedule, engine.step = recording_schedule, timed_step
    work = w3(engine.model_config.vocab_size, num_requests=num_requests, seed=seed)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in work.max_tokens]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    llm.generate(work.prompts, params, use_tqdm=False)
    sync()
    wall = time.perf_counter() - start
    core.scheduler.schedule, engine.step = schedule, step
    by_kind = collections.defaultdict(lambda: {"steps": 0, "wall_s": 0.0, "tokens": 0, "seqs": 0})
    for dt, new in steps:
        for num_tokens, num_seqs in new or [(0, 0)]:
            row = by_kind[kind_of(num_tokens, num_seqs) if new else "nothing launched"]
            row["steps"] += 1
            row["wall_s"] += dt / max(1, len(new))
            row["tokens"] += num_tokens
            row["seqs"] += num_seqs
    for row in by_kind.values():
        row["ms_per_step"] = 1e3 * row["wall_s"] / row["steps"]
        row["mean_tokens"] = row["tokens"] / row["steps"]
        row["mean_seqs"] = row["seqs"] / row["steps"]
    return {"wall_s": wall, "output_tok_s": sum(work.max_tokens) / wall, "by_kind": dict(by_kind),
            "graph_replays": dict(engine.runner.graph_replays)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="mistral-7b")
    p.add_argument("--num-requests", type=int, default=1000)
    args = p.parse_args()
    llm = LLM(args.model, load_format="dummy")
    warm = w3(llm.llm_engine.model_config.vocab_size, num_requests=16, seed=2000)
    llm.generate(warm.prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in warm.max_tokens], use_tqdm=False)
    scheduler = llm.llm_engine.scheduler
    hardware = f"{hardware_name()}, {args.model}, {llm.llm_engine.config.dtype}, random weights"
    result = {"hardware": hardware, "commit": source_commit(),
              "command": "python scripts/w3_offline_profile.py", "max_num_seqs": scheduler.max_num_seqs,
              "max_num_batched_tokens": scheduler.max_num_batched_tokens,
              "num_kv_blocks": scheduler.blocks.num_total_blocks}
    result["timed"] = timed_run(llm, 2001, args.num_requests)
    print(json.dumps(result, indent=1), flush=True)
    with profiler([torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        timed_run(llm, 2002, args.num_requests)
    gpu = torch.cuda.is_available()  # on a CPU (a try of this script) the ops' own CPU time stands in
    kernels = sorted(((e.key, (e.self_device_time_total if gpu else e.self_cpu_time_total) / 1e3, e.count)
                      for e in prof.key_averages()), key=lambda r: -r[1])
    gpu_ms = sum(ms for _, ms, _ in kernels)
    result["profiled_kernels_ms"] = {"gpu_ms_total": gpu_ms,
                                     "top": [{"kernel": k[:100], "ms": ms, "calls": n} for k, ms, n in kernels[:30]]}
    print(json.dumps(result["profiled_kernels_ms"], indent=1))
    json.dump(result, open(args.out, "w"), indent=1)
    llm.shutdown()


if __name__ == "__main__":
    main()
