"""A mixed step against its floor: sequences decoding, plus one prompt chunk in every step.

    python -m minivllm_lab.bench.mixed_step --out figures/mixed_step_h200.json   # GPU: Mistral-7B shape, bf16
    python -m minivllm_lab.bench.mixed_step --smoke                               # tiny sizes, any machine

For the graphed engine (the default) and the eager one (enforce_eager=True), through the public engine: the step
period of `decodes` sequences decoding alone, then of the same plus a `chunk`-token piece of a long prompt (the
step budget is decodes + chunk), each the median of several runs of consecutive steps with the overlap on and the
startup objects out of the garbage collector's sight, as in serving. The floor is the graphed decode step plus the
chunk's matmul FLOPs at the bf16 rate measured in the same run. On a GPU a torch.profiler table of a few graphed
mixed steps says where their time goes.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from minivllm import LLM, SamplingParams
from minivllm.engine.core import startup_objects_frozen
from minivllm.models.loader import resolve_model

from ..machine import tiny_checkpoint
from . import roofline
from .metrics import hardware_name, save_json, source_commit
from .profile import profiler

GPU_SIZES = dict(decodes=256, chunk=512, chunks=7, steps=14, runs=5, prompt_len=64)
SMOKE_SIZES = dict(decodes=4, chunk=8, chunks=5, steps=3, runs=2, prompt_len=5)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def step_period_ms(engine, num_steps: int, device) -> float:
    """Milliseconds per step over `num_steps` consecutive steps, the startup objects frozen as in serving."""
    _sync(device)
    start = time.perf_counter()
    with startup_objects_frozen():
        for _ in range(num_steps):
            engine.step()
    _sync(device)
    return (time.perf_counter() - start) / num_steps * 1e3


def add_decodes(engine, decodes: int, prompt_len: int, max_tokens: int) -> torch.Generator:
    """`decodes` requests of random `prompt_len`-token prompts, each answering `max_tokens` tokens (EOS ignored);
    returns the generator that drew them, for the prompts that follow."""
    vocab = engine.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    for i in range(decodes):
        engine.add_request(f"d{i}", torch.randint(0, vocab, (prompt_len,), generator=g).tolist(),
                           SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return g


def measure(model: str, engine_args: dict, decodes: int, chunk: int, chunks: int, steps: int, runs: int,
            prompt_len: int, profile: bool = False) -> dict:
    """decode_ms and mixed_ms (medians), their runs, the (decodes, prompt tokens) of the timed steps; with
    `profile`, the profiler's table of a few mixed steps."""
    llm = LLM(model, max_num_seqs=decodes + 1, max_num_batched_tokens=decodes + chunk, **engine_args)
    engine, device = llm.llm_engine, llm.llm_engine.config.device
    vocab = engine.model.config.vocab_size
    shapes, schedule = [], engine.scheduler.schedule

    def recorded_schedule():  # what each step carried, to show what was timed
        out = schedule()
        shapes.append((len(out.decodes), sum(e.num_tokens for e in out.prefills)))
        return out

    engine.scheduler.schedule = recorded_schedule
    g = add_decodes(engine, decodes, prompt_len, max_tokens=10 * (steps + chunks) * runs + 100)
    while any(seq.num_uncomputed_tokens > 1 for seq in engine.requests.values()) or len(shapes) < 4:
        engine.step()  # every prompt in; a few decodes as warm-up
    shapes.clear()
    decode = [step_period_ms(engine, steps, device) for _ in range(runs)]
    row = {"decode_steps": sorted(set(shapes))}
    mixed, mixed_shapes = [], set()
    for run in range(runs + profile):
        engine.add_request(f"p{run}", torch.randint(0, vocab, (chunk * chunks,), generator=g).tolist(),
                           SamplingParams(max_tokens=1))
        engine.step()  # the prompt joins the step being planned
        shapes.clear()
        if run < runs:
            mixed.append(step_period_ms(engine, chunks - 2, device))
            mixed_shapes |= set(shapes)
        else:
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with profiler(activities) as prof:
                step_period_ms(engine, chunks - 2, device)
            row["profile"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
        while f"p{run}" in engine.requests:
            engine.step()
    row.update(decode_ms=statistics.median(decode), mixed_ms=statistics.median(mixed), decode_ms_runs=decode,
               mixed_ms_runs=mixed, mixed_steps=sorted(mixed_shapes), graph_replays=dict(engine.runner.graph_replays))
    llm.shutdown()
    return row


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m minivllm_lab.bench.mixed_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: mistral-7b (dummy weights); a tiny random Llama "
                                                 "with --smoke")
    p.add_argument("--out", default=None, help="JSON path (default bench-results/mixed_step.json)")
    p.add_argument("--smoke", action="store_true", help=f"tiny sizes: {SMOKE_SIZES}")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    sizes = SMOKE_SIZES if args.smoke else GPU_SIZES
    model = args.model or (tiny_checkpoint() if args.smoke else "mistral-7b")
    engine_args = dict(load_format="dummy", dtype="bfloat16" if cuda else "float32",
                       max_model_len=4096 if cuda else 128)
    rate = roofline.measure_matmul_flops() if cuda else None
    shape = roofline.ModelShape.from_config(resolve_model(model).config)
    chunk_flops = roofline.layers_matmul_flops(shape, sizes["chunk"])
    graphed = measure(model, engine_args, **sizes, profile=cuda)
    eager = measure(model, dict(engine_args, enforce_eager=True), **sizes)
    result = {
        "hardware": f"{hardware_name()}, {model}" + (", bf16, random weights" if cuda else ", float32"),
        "commit": source_commit(),
        "command": "python -m minivllm_lab.bench.mixed_step" + (" --smoke" if args.smoke else ""),
        "decodes": sizes["decodes"], "chunk_tokens": sizes["chunk"],
        "decode_ms": graphed["decode_ms"], "mixed_ms": graphed["mixed_ms"],
        "eager_decode_ms": eager["decode_ms"], "eager_mixed_ms": eager["mixed_ms"],
        "chunk_matmul_tflop": chunk_flops / 1e12,
    }
    if rate is not None:  # the floor needs the GPU's measured matmul rate
        result.update(bf16_tflops_measured=rate / 1e12, floor_ms=graphed["decode_ms"] + chunk_flops / rate * 1e3)
        result["mixed_over_floor"] = result["mixed_ms"] / result["floor_ms"]
    result.update(graphed={k: v for k, v in graphed.items() if k != "profile"}, eager=eager,
                  profile=graphed.get("profile"))
    save_json(args.out or "bench-results/mixed_step.json", result)
    print({k: v for k, v in result.items() if k not in ("graphed", "eager", "profile")})
    if graphed.get("profile"):
        print(graphed["profile"])
    return result


if __name__ == "__main__":
    main()
