"""Structured outputs measured: what the grammar's mask costs per step, and what it buys (valid JSON), in one run.

    python -m minivllm_lab.bench.structured            # CPU: SmolLM2-135M; GPU: the Mistral-7B shape (see below)
    python -m minivllm_lab.bench.structured --smoke    # a minute on a CPU: small batches, few prompts

1. Per-step cost, at batch 1, 64 and 256 (W1-like: prompts of random token ids, lengths uniform in a range):
   the same engine runs the batch twice, every request under a JSON schema, then none; after the prefills and
   a warm-up, the wall time of each `step()` while the whole batch decodes (with async scheduling, the default,
   that is the time between two steps' outputs: the GPU's step plus whatever of the CPU's work it cannot hide).
   Medians. Also the CPU time of filling the bitmask (`grammar_bitmask`, the last steps'), which the overlap
   has to hide.
   The schema is an object with one long string (minLength 400), so that no request ends before the steps are
   counted: most tokens of real JSON answers are inside strings too.
2. W1 (`workloads.w1`: 60 requests, prompts of 16-256 random ids, 150 output tokens each) end to end, `generate` with
   a JSON schema on every request against without, the two taking turns (medians of `--w1-repeats`, after a
   warm-up): output tokens per second. The schema's one string is long enough (minLength 4000) that every
   request writes its 150 tokens, as without it.
3. The valid-JSON rate of SmolLM2-135M-Instruct (real weights) asked for JSON by N prompts: unconstrained (a
   lenient reading: the text from its first "{" to its last "}" must parse and validate) against constrained.

On a GPU the per-step part uses the Mistral-7B shape with dummy weights (as every GPU benchmark here), with
SmolLM2's tokenizer and vocabulary (49152 instead of 32000 tokens; the extra 71 MB of unembedding is under 1% of
the 14.5 GB read per step): the grammar needs a tokenizer that can spell JSON, and the word tokenizer of the
serving benchmarks (`word_model.py`, tokens "w0".."w31999") cannot. Random weights write random but valid JSON
under the grammar, which is all the per-step cost needs. Part 3 always uses SmolLM2's real weights.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

from minivllm import LLM, SamplingParams, StructuredOutputsParams
from minivllm.models.loader import resolve_model
from minivllm.models.presets import MISTRAL_7B_CONFIG

from . import bench_extra
from .metrics import format_table, hardware_name, median, save_json

LONG_STRING = {"type": "object", "properties": {"answer": {"type": "string", "minLength": 400}},
               "required": ["answer"]}
W1_STRING = {"type": "object", "properties": {"answer": {"type": "string", "minLength": 4000}},
             "required": ["answer"]}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"type": "string", "maxLength": 24}},
          "required": ["name", "age", "city"]}
TOPICS = ["a customer", "a friend", "a teacher", "a doctor", "a football player", "a painter", "a pilot",
          "a chef", "a neighbour", "a student", "a scientist", "a singer"]


def gpu_folder() -> Path:
    """The Mistral-7B shape with SmolLM2's vocabulary and tokenizer files (dummy weights: no weights at all)."""
    smollm2 = resolve_model("smollm2-135m").folder
    folder = Path(tempfile.mkdtemp(prefix="mistral-7b-smollm2-vocab-"))
    config = {**MISTRAL_7B_CONFIG, "vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2}
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (smollm2 / name).exists():
            shutil.copy(smollm2 / name, folder / name)
    return folder


def step_times_ms(llm, prompts: list[list[int]], params: SamplingParams, warmup: int, steps: int) -> list[float]:
    """Wall time of each step() while the whole batch decodes, after `warmup` such steps."""
    engine, times = llm.llm_engine, []
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{i}", prompt, params)
    decoding = 0
    while engine.has_unfinished_requests() and len(times) < steps:
        full = all(seq.num_output_tokens > 0 for seq in engine.scheduler.requests.values())
        start = time.perf_counter()
        engine.step()
        if llm.llm_engine.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) * 1e3
        if full and len(engine.scheduler.running) == len(prompts):
            decoding += 1
            if decoding > warmup:
                times.append(elapsed)
    for request_id in list(engine.requests):
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    return times


class TimedMask:
    """Wraps an engine's `grammar_bitmask` to record the CPU time of each fill (the work the overlap must hide)."""

    def __init__(self, manager):
        self.manager, self.fill, self.times_ms = manager, manager.grammar_bitmask, []

    def __enter__(self):
        def timed(seqs):
            start = time.perf_counter()
            mask = self.fill(seqs)
            self.times_ms.append((time.perf_counter() - start) * 1e3)
            return mask
        self.manager.grammar_bitmask = timed
        return self

    def __exit__(self, *exc):
        del self.manager.grammar_bitmask  # the class's method again


def per_step_cost(llm, batch_sizes, prompt_lens, warmup: int, steps: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    vocab = llm.llm_engine.model_config.vocab_size
    spec = StructuredOutputsParams(json=LONG_STRING)
    rows = []
    for batch in batch_sizes:
        prompts = [[rng.randrange(100, vocab) for _ in range(rng.randint(*prompt_lens))] for _ in range(batch)]
        # (No per-request seed: a seeded row draws with its own generator, one more kernel and Python call per
        # row and step, which most traffic does not pay and which would load the host that the mask also needs.)
        plain = SamplingParams(temperature=1.0, max_tokens=warmup + steps + 8, ignore_eos=True)
        constrained = SamplingParams(temperature=1.0, max_tokens=warmup + steps + 8, ignore_eos=True,
                                     structured_outputs=spec)
        without = median(step_times_ms(llm, prompts, plain, warmup, steps))
        with TimedMask(llm.llm_engine.structured_output) as mask:
            with_ = median(step_times_ms(llm, prompts, constrained, warmup, steps))
        rows.append({"batch": batch, "step_ms_plain": round(without, 2), "step_ms_json_schema": round(with_, 2),
                     "slowdown_pct": round(100 * (with_ / without - 1), 1),
                     "mask_fill_ms": round(median(mask.times_ms[-steps:]), 3)})
    return rows


def w1_throughput(llm, repeats: int) -> list[dict]:
    """W1 through `generate`, with a JSON schema on every request and without, taking turns: output tok/s."""
    from .workloads import w1

    workload = w1(llm.llm_engine.model_config.vocab_size)
    spec = StructuredOutputsParams(json=W1_STRING)
    ways = {"plain": None, "json_schema": spec}
    seconds = {name: [] for name in ways}
    for r in range(repeats + 1):  # run 0 warms up (and compiles the grammar: cached after)
        for name, structured in ways.items():
            params = [SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True, structured_outputs=structured)
                      for n in workload.max_tokens]  # (no seeds: see per_step_cost)
            start = time.perf_counter()
            outs = llm.generate(workload.prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            assert tokens == sum(workload.max_tokens), "every request must write its 150 tokens"
            if r:
                seconds[name].append(elapsed)
    tokens = sum(workload.max_tokens)
    rows = [{"way": name, "seconds": round(median(s), 3), "output_tok_s": round(tokens / median(s), 1)}
            for name, s in seconds.items()]
    rows[1]["slowdown_pct"] = round(100 * (rows[1]["seconds"] / rows[0]["seconds"] - 1), 1)
    return rows


def valid_json_rate(llm, n: int, max_tokens: int, seed: int = 0) -> list[dict]:
    with bench_extra():
        import jsonschema

    rng = random.Random(seed)
    prompts = [[{"role": "user", "content": f"Describe {rng.choice(TOPICS)} as a JSON object with the keys "
                                            f"name, age and city. Answer with the JSON only."}] for _ in range(n)]
    rows = []
    for label, spec in (("unconstrained", None), ("json_schema", StructuredOutputsParams(json=PERSON))):
        params = [SamplingParams(temperature=0.7, seed=i, max_tokens=max_tokens, structured_outputs=spec)
                  for i in range(n)]
        outs = llm.chat(prompts, params, use_tqdm=False)
        valid = 0
        for out in outs:
            text = out.outputs[0].text
            try:
                jsonschema.validate(json.loads(text[text.index("{"):text.rindex("}") + 1]), PERSON)
                valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
        reasons = [o.outputs[0].finish_reason for o in outs]
        rows.append({"mode": label, "prompts": n, "valid": valid, "valid_pct": round(100 * valid / n, 1),
                     "finished_stop": reasons.count("stop"), "finished_length": reasons.count("length")})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="small batches and few prompts (a minute on a CPU)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if there is one)")
    parser.add_argument("--batch-sizes", default=None, help="comma-separated (default 1,64,256)")
    parser.add_argument("--num-prompts", type=int, default=None, help="prompts of the valid-JSON rate")
    parser.add_argument("--w1-repeats", type=int, default=None,
                        help="W1 runs each way (default: 3 on a GPU, 0 (skipped) on a CPU or with --smoke)")
    parser.add_argument("--out", default="figures/structured_outputs.json")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.startswith("cuda")
    batch_sizes = [int(b) for b in (args.batch_sizes or ("1,8" if args.smoke else "1,64,256")).split(",")]
    # On a CPU, short prompts and few steps: the prefill of 256 prompts of up to 256 tokens takes minutes there.
    prompt_lens, warmup, steps = ((16, 256), 5, 30) if on_gpu else ((16, 32), 2, 10)
    if on_gpu:
        step_llm = LLM(str(gpu_folder()), load_format="dummy", dtype="bfloat16", device=device,
                       max_num_seqs=max(batch_sizes), max_model_len=1024)
        shape = "Mistral-7B shape, dummy weights, bf16, SmolLM2's vocabulary (49152)"
    else:
        step_llm = LLM("smollm2-135m", dtype="float32", device=device, max_num_seqs=max(batch_sizes),
                       max_model_len=512, num_kv_blocks=max(batch_sizes) * 4 + 16)
        shape = "SmolLM2-135M, float32"
    hardware = hardware_name(device)
    print(f"per-step cost of a JSON schema on every request ({shape}; {hardware}):")
    steps_rows = per_step_cost(step_llm, batch_sizes, prompt_lens, warmup, steps)
    print(format_table(steps_rows, list(steps_rows[0])))
    w1_repeats = args.w1_repeats if args.w1_repeats is not None else (3 if on_gpu and not args.smoke else 0)
    w1_rows = []
    if w1_repeats:
        print(f"\nW1 with a JSON schema on every request against without ({shape}; {hardware}):")
        w1_rows = w1_throughput(step_llm, w1_repeats)
        print(format_table(w1_rows, ["way", "seconds", "output_tok_s", "slowdown_pct"]))
    del step_llm
    json_llm = LLM("smollm2-135m", dtype="float32" if not on_gpu else "bfloat16", device=device, max_model_len=512)
    n = args.num_prompts or (8 if args.smoke else 32)
    print(f"\nvalid-JSON rate of SmolLM2-135M-Instruct asked for JSON ({n} prompts, temperature 0.7; {hardware}):")
    rate_rows = valid_json_rate(json_llm, n, max_tokens=96)
    print(format_table(rate_rows, list(rate_rows[0])))
    path = save_json(args.out, {"device": device, "model_per_step": shape, "prompt_lens": prompt_lens,
                                "warmup_steps": warmup, "measured_steps": steps, "per_step": steps_rows,
                                "w1": w1_rows, "valid_json": rate_rows})
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
