"""A mixed step against its floor, on the GPU: 256 sequences decoding, plus one 512-token prompt chunk per step.

Mistral-7B's shape, bf16, random weights (load_format="dummy"), through the public engine. For the graphed engine
(the default) and the eager one (enforce_eager=True): the step period of 256 decodes alone, then of the same 256
plus a 512-token chunk (a long prompt chunked by a 768-token budget), each the median over several runs of
consecutive steps. The floor is the graphed decode step plus the chunk's matmul FLOPs at the bf16 rate measured
in this run. A torch.profiler table of a few graphed mixed steps says where their time goes.
Usage on the GPU machine: python scripts/mixed_step.py --out $OUT/mixed_step_h200.json
"""
import argparse
import json
import statistics
import subprocess
import time

import torch

from minivllm import LLM, SamplingParams
from minivllm.models.presets import MISTRAL_7B_CONFIG as CFG
from minivllm_lab.bench.metrics import hardware_name

DECODES, CHUNK, STEPS, RUNS = 256, 512, 14, 5
CHUNKS = 7  # a prompt of 7 chunks: 3,584 tokens, within MAX_MODEL_LEN
MAX_MODEL_LEN = 4096

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="bench-results/mixed_step_h200.json")
parser.add_argument("--profile", default=None, help="where to write the profiler's table (default: beside --out)")
args = parser.parse_args()


def bf16_tflops() -> float:
    """The bf16 matmul rate of this GPU, measured (8192^3, median of 20)."""
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * 8192**3 / statistics.median(times[5:]) / 1e12


def linear_params_per_token() -> int:
    """Weights a token multiplies through in the decoder layers (q, k, v, o, gate, up, down)."""
    h, d = CFG["hidden_size"], CFG["hidden_size"] // CFG["num_attention_heads"]
    qkvo = h * (CFG["num_attention_heads"] * d) * 2 + h * (CFG["num_key_value_heads"] * d) * 2
    return CFG["num_hidden_layers"] * (qkvo + 3 * h * CFG["intermediate_size"])


def step_period_ms(engine, num_steps: int) -> float:
    """Milliseconds per step over `num_steps` consecutive steps (the overlap on, as in serving)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(num_steps):
        engine.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / num_steps * 1e3


def measure(enforce_eager: bool, profile_path=None) -> dict:
    llm = LLM("mistral-7b", load_format="dummy", dtype="bfloat16", max_model_len=MAX_MODEL_LEN,
              max_num_seqs=DECODES + 1, max_num_batched_tokens=DECODES + CHUNK, enforce_eager=enforce_eager)
    engine = llm.llm_engine
    shapes, schedule = [], engine.scheduler.schedule

    def recorded_schedule():  # each step's (decodes, prompt tokens), to show what was timed
        out = schedule()
        shapes.append((len(out.decodes), sum(e.num_tokens for e in out.prefills)))
        return out

    engine.scheduler.schedule = recorded_schedule
    g = torch.Generator().manual_seed(0)
    for i in range(DECODES):  # short prompts, answers longer than the whole measurement
        engine.add_request(f"d{i}", torch.randint(0, 32000, (64,), generator=g).tolist(),
                           SamplingParams(max_tokens=2000, ignore_eos=True))
    for _ in range(40):  # every prompt in, then decodes only
        engine.step()
    shapes.clear()
    decode = [step_period_ms(engine, STEPS) for _ in range(RUNS)]
    decode_shapes = sorted(set(shapes))
    mixed, mixed_shapes = [], set()
    for run in range(RUNS):  # each step of a chunked prompt carries the 256 decodes and 512 prompt tokens
        engine.add_request(f"p{run}", torch.randint(0, 32000, (CHUNK * CHUNKS,), generator=g).tolist(),
                           SamplingParams(max_tokens=1))
        engine.step()  # the request enters the step being planned
        shapes.clear()
        mixed.append(step_period_ms(engine, CHUNKS - 2))
        mixed_shapes |= set(shapes)
        while f"p{run}" in engine.requests:
            engine.step()
    row = {"decode_ms": statistics.median(decode), "mixed_ms": statistics.median(mixed),
           "decode_ms_runs": decode, "mixed_ms_runs": mixed,
           "timed_steps_decodes_and_prompt_tokens": {"decode": decode_shapes, "mixed": sorted(mixed_shapes)},
           "graph_replays": dict(engine.runner.graph_replays)}
    if profile_path:
        engine.add_request("profiled", torch.randint(0, 32000, (CHUNK * CHUNKS,), generator=g).tolist(),
                           SamplingParams(max_tokens=1))
        engine.step()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            step_period_ms(engine, CHUNKS - 2)
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
        with open(profile_path, "w") as f:
            f.write(f"{CHUNKS - 2} graphed mixed steps (256 decodes + a 512-token chunk each)\n" + table)
        print(table)
    llm.shutdown()
    del llm, engine
    torch.cuda.empty_cache()
    return row


rate = bf16_tflops()
chunk_tflop = 2 * CHUNK * linear_params_per_token() / 1e12
graphed = measure(False, args.profile or args.out.replace(".json", "_profile.txt"))
eager = measure(True)
floor_ms = graphed["decode_ms"] + chunk_tflop / rate * 1e3
result = {
    "hardware": f"{hardware_name()}, Mistral-7B shape, bf16, random weights",
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "command": "python scripts/mixed_step.py",
    "decodes": DECODES, "chunk_tokens": CHUNK,
    "decode_ms": graphed["decode_ms"], "mixed_ms": graphed["mixed_ms"], "floor_ms": floor_ms,
    "mixed_over_floor": graphed["mixed_ms"] / floor_ms,
    "eager_decode_ms": eager["decode_ms"], "eager_mixed_ms": eager["mixed_ms"],
    "bf16_tflops_measured": rate, "chunk_matmul_tflop": chunk_tflop,
    "graphed": graphed, "eager": eager,
}
with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=1))
