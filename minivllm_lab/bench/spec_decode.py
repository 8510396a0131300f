"""Speculative decoding measured: what a guess costs, how many are kept, and the speed-up, against the same
engine without speculation, in one run, with identical greedy text checked on every answer.

    python -m minivllm_lab.bench.spec_decode                 # real SmolLM2-135M (CPU or GPU), a few minutes
    python -m minivllm_lab.bench.spec_decode --smoke         # seconds: a tiny random model, any machine
    python -m minivllm_lab.bench.spec_decode --verify-model mistral-7b   # on a GPU: + a 7B verify step's cost

Three measurements (four with --verify-model):
- the verify cost: one forward's time against the number of tokens per sequence (1 = a plain decode,
  k + 1 = a verify of k guesses), at several batch sizes (`forward_ms`);
- with --verify-model (random weights of that shape): the time of a whole batch-1 step through the model
  runner and the paged cache, a decode against a verify of k = 1..8 guesses, replayed as CUDA graphs on a
  GPU and run eagerly (`verify_step_ms`);
- the tasks, one request at a time (batch 1): answers that copy their input (correcting a given text,
  editing given code, answering from a given document) and free chat; for each proposer setting, output
  tokens per second, the guesses kept (acceptance rate) and tokens per verify step (mean acceptance length);
- when it stops paying: the copy tasks at growing batch sizes, with and without speculation.
Greedy (temperature 0): the text must be the same with and without speculation, or the run fails.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from minivllm import LLM, SamplingParams
from minivllm.attention import NoCacheMetadata
from minivllm.chat import encode_chat
from minivllm.core.scheduler import ScheduledSequence, SchedulerOutput
from minivllm.models.loader import resolve_model

from ..machine import free_memory, tiny_checkpoint
from .metrics import cuda_time_ms, format_table, hardware_name, median, save_json

DOCUMENT = (
    "Returns policy. Items can be returned within 30 days of delivery for a full refund. To start a return, "
    "open the Orders page, choose the order, and click Return items. Print the prepaid label and drop the "
    "parcel at any post office. Refunds are issued to the original payment method within 5 business days "
    "after the parcel arrives at our warehouse. Gift cards and opened software cannot be returned.")
CODE = '''def average(values):
    total = 0
    for value in values:
        total = total + value
    return total / len(values)
'''
TEXT = ("Our team met on monday to review the the launch plan. We agreed that the beta will start on the "
        "first of june, that every customer gets an email two days before, and that support will be "
        "available from nine to five. The final decision on pricing was postponed to next week.")

COPY_TASKS = {
    "correct a text": "Correct the spelling and grammar of this text and return the whole corrected text:\n\n" + TEXT,
    "edit code": "Add a docstring to this Python function and return the whole function:\n\n" + CODE,
    "answer from a document": "Using the document below, explain how to return an item, in the document's own "
                              "words.\n\n" + DOCUMENT,
}
CHAT_TASKS = {
    "tips": "Give me three tips for writing clear emails.",
    "story": "Write a short story about a robot who learns to paint.",
    "explain": "Why is the sky blue? Explain it to a ten-year-old.",
}


def write_draft_from_first_layers(folder: str, num_layers: int, out: str | Path) -> str:
    """A draft made from a model itself: its embedding, its first `num_layers` decoder layers, its final norm
    and LM head (the same vocabulary, by construction). Written as an HF folder next to the tokenizer files."""
    import shutil

    from safetensors.torch import load_file, save_file
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((Path(folder) / "config.json").read_text())
    config["num_hidden_layers"] = num_layers
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {}
    for shard in sorted(Path(folder).glob("*.safetensors")):
        for name, tensor in load_file(shard).items():
            parts = name.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= num_layers:
                continue
            tensors[name] = tensor
    save_file(tensors, out / "model.safetensors")
    for extra in Path(folder).iterdir():
        if extra.name.startswith(("tokenizer", "special_tokens", "generation_config", "vocab", "merges")):
            shutil.copy(extra, out / extra.name)
    return str(out)


@torch.inference_mode()
def forward_ms(llm: LLM, tokens_per_seq: list[int], batches: list[int], repeats: int) -> list[dict]:
    """One forward (no cache: the cost of the matmuls and the LM head, which is what more tokens per sequence
    add) against tokens per sequence, at each batch size; median of `repeats`."""
    model, device = llm.llm_engine.model, llm.llm_engine.device
    rows = []
    for batch in batches:
        for t in tokens_per_seq:
            ids = torch.randint(100, 1000, (batch * t,), device=device)
            positions = torch.arange(t, device=device).repeat(batch)
            cu = torch.arange(0, batch * t + 1, t, device=device, dtype=torch.int32)
            meta = NoCacheMetadata(cu, t)
            times = cuda_time_ms(lambda: model.compute_logits(model(ids, positions, meta)), warmup=2,
                                 repeats=repeats, device=device)
            rows.append({"batch": batch, "tokens_per_seq": t, "forward_ms": median(times)})
    return rows


@torch.inference_mode()
def verify_step_ms(llm: LLM, ks: list[int], context: int, repeats: int) -> list[dict]:
    """A batch-1 step's time through the model runner (inputs, paged attention, logits), after a prompt of
    `context` tokens: a decode (k = 0) and a verify of k random guesses, for each k, median of `repeats`
    (CUDA events on a GPU). With graphs (a GPU, not `enforce_eager`), the runner captures its graphs again
    for each k and the step replays them; then each step once more without graphs, for comparison."""
    engine, runner = llm.llm_engine, llm.llm_engine.runner
    engine.add_request("verify-cost", list(range(100, 100 + context)),
                       SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    while not engine.scheduler.requests["verify-cost"].num_output_tokens:
        engine.step()  # the prompt's prefill, which samples the token the timed steps feed
    seq = engine.scheduler.requests["verify-cost"]
    start = seq.num_computed_tokens
    engine.scheduler.blocks.allocate(seq, start + 1 + max(ks))  # the guesses' slots
    guesses = torch.randint(100, 1000, (max(ks),)).tolist()
    graphed = runner.graphs is not None
    modes = ["graphs", "eager"] if graphed else ["eager"]
    rows = []
    for k in [0] + ks:
        entry = ScheduledSequence(seq, start, 1 + k, True, k > 0, guesses[:k])
        step = SchedulerOutput(verifies=[entry]) if k else SchedulerOutput(decodes=[entry])
        row = {"k": k, "tokens": 1 + k}
        for mode in modes:
            if mode == "graphs" and k:
                runner.capture_cuda_graphs(k)
            saved, runner.graphs = runner.graphs, (runner.graphs if mode == "graphs" else None)
            row[f"{mode}_ms"] = median(cuda_time_ms(lambda: runner.execute_model(step), warmup=3, repeats=repeats,
                                                    device=runner.device))
            runner.graphs = saved
        rows.append(row)
    for row in rows:
        for mode in modes:
            row[f"{mode}_vs_decode"] = row[f"{mode}_ms"] / rows[0][f"{mode}_ms"]
    engine.abort_request("verify-cost")
    return rows


def run_tasks(llm: LLM, prompts: dict[str, list[int]], params: SamplingParams) -> dict:
    """The prompts one at a time (batch 1) after one warm-up; totals and each answer's text."""
    llm.generate([next(iter(prompts.values()))], params, use_tqdm=False)
    before = llm.llm_engine.get_stats()
    texts, per_task, tokens, seconds = {}, {}, 0, 0.0
    for name, ids in prompts.items():
        start = time.perf_counter()
        out = llm.generate([ids], params, use_tqdm=False)[0].outputs[0]
        elapsed = time.perf_counter() - start
        seconds += elapsed
        texts[name], tokens = out.token_ids, tokens + len(out.token_ids)
        per_task[name] = len(out.token_ids) / elapsed
    after = llm.llm_engine.get_stats()
    drafts, guessed, kept = (after[k] - before[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"))
    return {"tok_s": tokens / seconds, "tokens": tokens, "acceptance_rate": kept / guessed if guessed else None,
            "mean_acceptance_length": 1 + kept / drafts if drafts else None, "texts": texts, "per_task": per_task}


def run_batch(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> float:
    llm.generate(prompts[:1], params, use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m minivllm_lab.bench.spec_decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: smollm2-135m (a tiny random model with --smoke)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--ks", default="2,4,6", help="n-gram guesses per step to try")
    p.add_argument("--draft-layers", type=int, default=8, help="the draft: the model's first N layers (0 = none)")
    p.add_argument("--batches", default="1,4,16", help="batch sizes of the when-it-pays sweep")
    p.add_argument("--device", default=None)
    p.add_argument("--verify-model", default=None,
                   help="also time batch-1 verify steps (k = 1..8) of this model's shape, random weights")
    p.add_argument("--verify-context", type=int, default=512, help="the prompt before those timed steps")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default="spec-decode.json")
    args = p.parse_args(argv)
    smoke = args.smoke
    model = args.model or (tiny_checkpoint(num_layers=2, vocab_size=1024) if smoke else "smollm2-135m")
    max_tokens = 12 if smoke else args.max_tokens
    ks = [2] if smoke else [int(k) for k in args.ks.split(",")]
    batches = [1, 2] if smoke else [int(b) for b in args.batches.split(",")]
    engine_args = dict(max_model_len=1024, device=args.device)
    if torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu")).type == "cuda":
        # Two engines live at once (with and without speculation): on a GPU each would size its KV pool from
        # what the other left. A pool for the largest batch of full-length sequences is all a run needs.
        engine_args["num_kv_blocks"] = max(batches) * 1024 // 16
    base = LLM(model, **engine_args)
    device = str(base.llm_engine.device)
    tokenizer = base.llm_engine.tokenizer
    if tokenizer is not None:
        encode = {name: encode_chat(tokenizer, [{"role": "user", "content": text}])
                  for name, text in {**COPY_TASKS, **CHAT_TASKS}.items()}
    else:  # a tiny random model: token ids that repeat (copy) or not (chat)
        g = torch.Generator().manual_seed(0)
        encode = {name: (torch.randint(5, 1000, (20,), generator=g).tolist() * (3 if name in COPY_TASKS else 1))
                  for name in {**COPY_TASKS, **CHAT_TASKS}}
    groups = {"copy": {n: encode[n] for n in COPY_TASKS}, "chat": {n: encode[n] for n in CHAT_TASKS}}
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens)
    result = {"hardware": hardware_name(device), "threads": torch.get_num_threads(), "device": device,
              "model": str(model), "max_tokens": max_tokens}

    if args.verify_model or smoke:
        # One sequence (graphs of batch 1 only); no overlap, so that no step is in flight between the timed ones.
        verify_llm = LLM(args.verify_model or model, load_format="dummy", max_model_len=1024, max_num_seqs=1,
                         num_kv_blocks=1024 // 16, device=args.device, async_scheduling=False)
        result["verify_model"] = str(args.verify_model or model)
        result["verify_step"] = verify_step_ms(verify_llm, [1, 2] if smoke else list(range(1, 9)),
                                               16 if smoke else args.verify_context, 3 if smoke else 20)
        print(format_table(result["verify_step"], list(result["verify_step"][0])), flush=True)
        del verify_llm
        free_memory()

    result["forward"] = forward_ms(base, [1, 2, 3, 5, 9], [1, 8] if smoke else [1, 8, 64], 2 if smoke else 5)
    print(format_table(result["forward"], ["batch", "tokens_per_seq", "forward_ms"]))

    settings = {"none": None}
    for k in ks:
        settings[f"ngram k={k}"] = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4}
    settings[f"ngram k={ks[-1]}, fixed k"] = settings[f"ngram k={ks[-1]}"] | {"adaptive": False}
    draft_dir = None
    if args.draft_layers and not smoke:
        draft_dir = tempfile.mkdtemp(prefix="minivllm-draft-")
        write_draft_from_first_layers(resolve_model(model).folder, args.draft_layers, draft_dir)
        settings[f"draft model ({args.draft_layers} layers) k=3"] = {"method": "draft_model", "model": draft_dir,
                                                                   "num_speculative_tokens": 3}
    rows, reference = [], {}
    for label, spec in settings.items():
        llm = base if spec is None else LLM(model, speculative_config=spec, **engine_args)
        for group, prompts in groups.items():
            run = run_tasks(llm, prompts, greedy)
            if spec is None:
                reference[group] = run
            elif run["texts"] != reference[group]["texts"]:
                raise AssertionError(f"{label} changed the greedy text of the {group} tasks")
            rows.append({"setting": label, "tasks": group, "tok_s": run["tok_s"],
                         "speedup": run["tok_s"] / reference[group]["tok_s"],
                         "acceptance_rate": run["acceptance_rate"],
                         "mean_acceptance_length": run["mean_acceptance_length"],
                         "speedup_per_task": {name: run["per_task"][name] / reference[group]["per_task"][name]
                                              for name in prompts}})
            print(format_table(rows[-1:], [c for c in rows[-1] if c != "speedup_per_task"]), flush=True)
        if llm is not base:
            del llm
            free_memory()
    result["tasks"] = rows

    spec = settings[f"ngram k={ks[len(ks) // 2]}"]
    spec_llm = LLM(model, speculative_config=spec, max_num_seqs=max(batches), **engine_args)
    copy_prompts = list(groups["copy"].values())
    sweep = []
    for batch in batches:
        prompts = [copy_prompts[i % len(copy_prompts)] for i in range(batch)]
        plain, guessed = run_batch(base, prompts, greedy), run_batch(spec_llm, prompts, greedy)
        sweep.append({"batch": batch, "plain_tok_s": plain, "spec_tok_s": guessed, "speedup": guessed / plain})
    result["batch_sweep"] = {"setting": f"ngram k={spec['num_speculative_tokens']}", "rows": sweep}
    print(format_table(sweep, ["batch", "plain_tok_s", "spec_tok_s", "speedup"]))
    print(f"wrote {save_json(args.out, result)}")
    return result


if __name__ == "__main__":
    main()
