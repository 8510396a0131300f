"""Parallel sampling measured: one request with n answers against n separate requests, KV blocks and time.

    python -m minivllm_lab.bench.parallel_sampling                      # SmolLM2-135M, n = 4, on this machine
    python -m minivllm_lab.bench.parallel_sampling --n 8 --prompt-len 512

The same prompt, the same seeds (answer i of the n > 1 request draws with seed + i, so it gives exactly the
tokens of the separate request with that seed: the run checks it), temperature 1, `ignore_eos` so every
answer has `--max-tokens` tokens. Three ways:
- `n`: one request, `SamplingParams(n=N)`: the prompt prefilled once, its blocks shared, the partly filled
  last one copied when each answer first writes into it;
- `separate`: N requests added at once, prefix caching off: N prefills, N copies of the prompt's blocks;
- `separate+cache`: the same with prefix caching on: the later requests find the first one's full blocks
  in the cache (named as soon as they are scheduled), so they share those too, but each still computes and
  holds its own last, partial block.
What each number is: `peak_blocks`, the most KV blocks in use at once (`get_stats()` after each step);
`prefill_tokens`, prompt tokens the model computed; `time_s`, wall time of the whole run (median of
`--repeats`, the three ways taking turns), after a warm-up.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from minivllm import LLM, SamplingParams

from .metrics import format_table, hardware_name, median, save_json


def run(llm: LLM, prompt: list[int] | list[list[int]], params: list[SamplingParams]) -> dict:
    """Step the engine to the end: `prompt` for every request (or one prompt per request). Returns the final
    outputs in request order, the answers' token ids (all answers, one list), the peak KV blocks in use, the
    prompt tokens the model computed and the wall time."""
    engine = llm.llm_engine
    prompts = prompt if prompt and isinstance(prompt[0], list) else [prompt] * len(params)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", p, sp)
    schedule, prefill, peak, outputs = engine.scheduler.schedule, 0, 0, {}

    def counting_schedule():
        nonlocal prefill
        out = schedule()
        prefill += sum(e.num_tokens for e in out.prefills)
        return out

    engine.scheduler.schedule = counting_schedule
    start = time.perf_counter()
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = out
            stats = engine.get_stats()
            peak = max(peak, stats["num_total_blocks"] - stats["num_free_blocks"])
    finally:
        engine.scheduler.schedule = schedule
    elapsed = time.perf_counter() - start
    ordered = [outputs[f"r{i}"] for i in range(len(params))]
    return {"peak_blocks": peak, "prefill_tokens": prefill, "time_s": elapsed, "outputs": ordered,
            "answers": [c.token_ids for out in ordered for c in out.outputs]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m minivllm_lab.bench.parallel_sampling",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default=None, help="default: cuda if there is one, else cpu")
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=250)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="bench-results/parallel_sampling.json")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = "float32" if device == "cpu" else "bfloat16"
    common = dict(device=device, dtype=dtype, max_model_len=args.prompt_len + args.max_tokens + 16,
                  block_size=args.block_size, num_kv_blocks=4 * args.n * (args.prompt_len + args.max_tokens) // 16,
                  max_num_seqs=max(8, args.n))
    sampling = dict(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True)
    ways = {"n": (False, [SamplingParams(n=args.n, seed=0, **sampling)]),
            "separate": (False, [SamplingParams(seed=i, **sampling) for i in range(args.n)]),
            "separate+cache": (True, [SamplingParams(seed=i, **sampling) for i in range(args.n)])}
    # A prompt per repeat (and one for the warm-up): with the cache on, none is in it before its run.
    prompts = [torch.randint(0, 10_000, (args.prompt_len,), generator=torch.Generator().manual_seed(r)).tolist()
               for r in range(args.repeats + 1)]
    engines = {name: LLM(args.model, enable_prefix_caching=cache, **common) for name, (cache, _) in ways.items()}
    results = {name: [] for name in ways}
    for prompt in [prompts[-1]] + prompts[:-1]:  # the warm-up first; the ways take turns (a shared machine's
        for name, (_, params) in ways.items():  # load then weighs on each alike)
            results[name].append(run(engines[name], prompt, params))
    rows, answers = [], {}
    for name, (_, params) in ways.items():
        timed = results[name][1:]
        answers[name] = [r.pop("answers") for r in timed]
        for r in results[name]:
            r.pop("outputs")
        rows.append({"way": name, **timed[0], "time_s": median([r["time_s"] for r in timed])})
    assert answers["n"] == answers["separate"] == answers["separate+cache"], "answer i must equal seed i alone"
    result = {"hardware": hardware_name(device), "model": args.model, "dtype": dtype, "device": device,
              "n": args.n, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
              "block_size": args.block_size, "rows": rows}
    print(f"{args.model} ({dtype}) on {result['hardware']}: n={args.n}, prompt {args.prompt_len} tokens, "
          f"{args.max_tokens} tokens per answer, blocks of {args.block_size}")
    print(format_table(rows, ["way", "peak_blocks", "prefill_tokens", "time_s"]))
    save_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
