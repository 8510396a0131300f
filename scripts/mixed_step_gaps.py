"""Where a mixed step's GPU sits idle: 256 sequences decoding plus one 512-token prompt chunk per step (the
Mistral-7B shape, bf16, dummy weights), graphed and eager, a few steps under torch.profiler.

    python scripts/mixed_step_gaps.py --out OUT.json      # a GPU

From the trace: the GPU's busy time per step, every gap of at least --min-gap-us between its kernels, and for each
gap whether the host launched the next kernel late (the launch came after the gap began: the host was behind)
or early (the work was queued and the GPU still waited), with the CPU ops around that launch. Also the host's
synchronizations (stream, event, device and pageable-copy waits) per step.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import tempfile

import torch

from minivllm import LLM, SamplingParams
from minivllm_lab.bench.metrics import hardware_name, source_commit
from minivllm_lab.bench.mixed_step import add_decodes
from minivllm_lab.bench.profile import profiler

SYNCS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemcpyAsync")


def mixed_engine(enforce_eager: bool, decodes=256, chunk=512, prompt_chunks=12):
    llm = LLM("mistral-7b", load_format="dummy", dtype="bfloat16", max_model_len=8192, max_num_seqs=decodes + 1,
              max_num_batched_tokens=decodes + chunk, enforce_eager=enforce_eager)
    engine = llm.llm_engine
    vocab = engine.model.config.vocab_size
    g = add_decodes(engine, decodes, prompt_len=64, max_tokens=2000)
    while any(seq.num_uncomputed_tokens > 1 for seq in engine.requests.values()):
        engine.step()
    for _ in range(8):
        engine.step()
    engine.add_request("p", torch.randint(0, vocab, (chunk * prompt_chunks,), generator=g).tolist(),
                       SamplingParams(max_tokens=1))
    for _ in range(3):  # the chunk joins; warm
        engine.step()
    return llm, engine


def analyse(trace: dict, steps: int, min_gap_us: float) -> dict:
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    runtime = {e["args"].get("correlation"): e for e in events if e.get("cat") == "cuda_runtime"}
    cpu_ops = sorted((e for e in events if e.get("cat") in ("cpu_op", "python_function", "user_annotation")),
                     key=lambda e: e["ts"])
    starts = [e["ts"] for e in cpu_ops]

    def around(ts: float) -> list[str]:
        """The CPU ops (innermost last) that enclose host time ts."""
        i = bisect.bisect_right(starts, ts)
        enclosing = [e for e in cpu_ops[max(0, i - 4000):i] if e["ts"] <= ts <= e["ts"] + e["dur"]]
        enclosing.sort(key=lambda e: -e["dur"])
        return [e["name"][:90] for e in enclosing][-6:]

    busy, gaps, end = 0.0, [], None
    for e in gpu:
        s, d = e["ts"], e["dur"]
        if end is not None and s - end >= min_gap_us:
            launch = runtime.get(e["args"].get("correlation"))
            launched = launch["ts"] if launch else None
            gaps.append({"gap_us": s - end, "next": e["name"][:80],
                         "host_late": launched is not None and launched > end,
                         "launch_after_gap_start_us": None if launched is None else launched - end,
                         "host_ops_at_launch": around(launched) if launched is not None else []})
        busy += max(0.0, s + d - max(s, end or s))
        end = max(end or 0.0, s + d)
    window = (end - gpu[0]["ts"]) if gpu else 0.0
    syncs = collections.Counter()
    sync_us = collections.Counter()
    for e in events:
        if e.get("cat") == "cuda_runtime" and e["name"] in SYNCS:
            syncs[e["name"]] += 1
            sync_us[e["name"]] += e["dur"]
    by_cause = collections.Counter()
    for g in gaps:
        by_cause[" > ".join(g["host_ops_at_launch"][-3:]) or g["next"]] += g["gap_us"]
    return {
        "steps": steps, "gpu_window_ms_per_step": window / steps / 1e3, "gpu_busy_ms_per_step": busy / steps / 1e3,
        "idle_ms_per_step": (window - busy) / steps / 1e3,
        "gaps_at_least_min_ms_per_step": sum(g["gap_us"] for g in gaps) / steps / 1e3,
        "host_late_gap_ms_per_step": sum(g["gap_us"] for g in gaps if g["host_late"]) / steps / 1e3,
        "num_gaps": len(gaps),
        "syncs_per_step": {k: v / steps for k, v in syncs.items()},
        "sync_ms_per_step": {k: v / steps / 1e3 for k, v in sync_us.items()},
        "gap_ms_per_step_by_host_ops": {k: v / steps / 1e3 for k, v in by_cause.most_common(12)},
        "largest_gaps": sorted(gaps, key=lambda g: -g["gap_us"])[:15],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--min-gap-us", type=float, default=20.0)
    args = p.parse_args()
    result = {"hardware": hardware_name(), "commit": source_commit(), "command": "python scripts/mixed_step_gaps.py"}
    for name, eager in (("graphs", False), ("eager", True)):
        llm, engine = mixed_engine(eager)
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with profiler(activities) as prof:
            for _ in range(args.steps):
                engine.step()
            torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            trace = json.load(open(f.name))
        result[name] = analyse(trace, args.steps, args.min_gap_us)
        result[name]["graph_replays"] = dict(engine.runner.graph_replays)
        llm.shutdown()
        del llm, engine
        torch.cuda.empty_cache()
        summary = {k: v for k, v in result[name].items() if k not in ("largest_gaps",)}
        print(name, json.dumps(summary, indent=1))
    json.dump(result, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
