"""Three measurements that explain numbers the notebooks and the structured-output bench report (a GPU run).

    python scripts/gpu_diagnose.py --tokenizer-dir DIR --out OUT.json      # DIR: SmolLM2's tokenizer files

1. structured: where a decode step's time goes with a JSON schema on every request and without (the Mistral-7B
   shape, dummy weights, bf16, SmolLM2's vocabulary), at batch 1, 64 and 256: the step's wall time, and the host
   time of each of its parts (schedule, execute_model, the books of the step before (`_process`), the bitmask,
   sample), medians over the measured steps; with the overlap on and off; with the bitmask applied by torch
   (`mask_logits`) and by xgrammar's GPU kernel. Then W1 end to end under three schemas.
2. forward_t1: one forward of T = 1 token (notebook 01's flat forward, eager) against transformers': wall time,
   GPU kernel time, kernel count and the host-device syncs, from torch.profiler.
4. fill: the grammar bitmask's fill alone on this host's CPU, on 1 to 8 threads, 16 to 256 rows.
3. store_kv: the KV-cache store at decode sizes (1 to 1024 tokens), Triton against torch's indexed copy:
   eager time per call back to back (what notebook 10's sweep measures), the GPU time of the kernels alone, and
   the time per call inside a CUDA graph (how the engine's decode steps run it).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from minivllm import LLM, SamplingParams, StructuredOutputsParams
from minivllm.models.presets import MISTRAL_7B_CONFIG
from minivllm_lab.bench import structured
from minivllm_lab.bench.kernels import store_kv_launch_cost
from minivllm_lab.bench.profile import launch_count

SCHEMA_400 = structured.LONG_STRING
ARRAY_400 = {"type": "array", "items": {"type": "string", "minLength": 400}, "minItems": 12}


def mistral_folder(tokenizer_dir: Path) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="mistral-7b-smollm2-vocab-"))
    config = {**MISTRAL_7B_CONFIG, "vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2}
    (folder / "config.json").write_text(json.dumps(config))
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, folder / f.name)
    return folder


class PartTimers:
    """Host wall time of each part of a step, by wrapping the engine's bound methods (one list per part)."""

    PARTS = {"schedule": ("scheduler", "schedule"), "execute_model": ("executor", "execute_model"),
             "process": (None, "_process"), "bitmask": ("structured_output", "grammar_bitmask"),
             "sample": ("executor", "sample")}

    def __init__(self, engine):
        self.engine, self.times, self.saved = engine, {p: [] for p in self.PARTS}, []

    def __enter__(self):
        for part, (attr, name) in self.PARTS.items():
            owner = self.engine if attr is None else getattr(self.engine, attr)
            original = getattr(owner, name)

            def timed(*a, _original=original, _part=part, **kw):
                start = time.perf_counter()
                try:
                    return _original(*a, **kw)
                finally:
                    self.times[_part].append((time.perf_counter() - start) * 1e3)
            setattr(owner, name, timed)
            self.saved.append((owner, name))
        return self

    def __exit__(self, *exc):
        for owner, name in self.saved:
            delattr(owner, name)

    def medians(self, last: int) -> dict:
        return {p: round(statistics.median(t[-last:]), 3) if t else 0.0 for p, t in self.times.items()}


def xgrammar_apply(self, logits, row_index=None):
    """GrammarBitmask.apply with xgrammar's GPU kernel instead of mask_logits (the variant measured)."""
    import xgrammar
    rows = self.rows if row_index is None else [row_index[i] for i in self.rows]
    logits = logits.clone()
    xgrammar.apply_token_bitmask_inplace(logits, self.bitmask.to(logits.device, non_blocking=True), indices=rows)
    return logits


def structured_part(folder: Path) -> dict:
    from minivllm.structured_output.bitmask import GrammarBitmask
    llm = LLM(str(folder), load_format="dummy", dtype="bfloat16", max_num_seqs=256, max_model_len=1024)
    engine, rng = llm.llm_engine, random.Random(0)
    rows = []
    for batch in (1, 64, 256):
        prompts = [[rng.randrange(100, 49152) for _ in range(rng.randint(16, 256))] for _ in range(batch)]
        for variant in ("plain", "json", "json+xgrammar_kernel", "plain serial", "json serial"):
            spec = StructuredOutputsParams(json=SCHEMA_400) if variant.startswith("json") else None
            params = SamplingParams(temperature=1.0, max_tokens=48, ignore_eos=True, seed=1, structured_outputs=spec)
            engine.config.async_scheduling = "serial" not in variant
            original_apply = GrammarBitmask.apply
            if "xgrammar" in variant:
                GrammarBitmask.apply = xgrammar_apply
            try:
                with PartTimers(engine) as parts:
                    steps = structured.step_times_ms(llm, prompts, params, warmup=5, steps=30)
            finally:
                GrammarBitmask.apply = original_apply
                engine.config.async_scheduling = True
            row = {"batch": batch, "variant": variant, "step_ms": round(statistics.median(steps), 3),
                   **{f"{p}_ms": v for p, v in parts.medians(30).items()}}
            print(row, flush=True)
            rows.append(row)
    w1 = []
    for name, schema, seeded in (("plain", None, True), ("string minLength 4000", structured.W1_STRING, True),
                                 ("plain, no seeds", None, False),
                                 ("string minLength 4000, no seeds", structured.W1_STRING, False),
                                 ("array of 12 strings of minLength 400, no seeds", ARRAY_400, False)):
        seconds = []
        from minivllm_lab.bench.workloads import w1 as make_w1
        workload = make_w1(49152)
        for r in range(3):
            ps = [SamplingParams(temperature=1.0, seed=i if seeded else None, max_tokens=n, ignore_eos=True,
                                 structured_outputs=StructuredOutputsParams(json=schema) if schema else None)
                  for i, n in enumerate(workload.max_tokens)]
            with PartTimers(engine) as parts:
                start = time.perf_counter()
                outs = llm.generate(workload.prompts, ps, use_tqdm=False)
                elapsed = time.perf_counter() - start
            if r:
                seconds.append(elapsed)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        row = {"schema": name, "seconds": round(statistics.median(seconds), 3), "output_tokens": tokens,
               "steps": len(parts.times["schedule"]),
               "host_ms_total": {p: round(sum(t), 1) for p, t in parts.times.items()}}
        print(row, flush=True)
        w1.append(row)
    del llm
    return {"per_step": rows, "w1": w1}


def wall_ms(fn, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(walls), 3)


def forward_t1_part() -> dict:
    from minivllm.attention import NoCacheMetadata
    from minivllm.models.loader import build_model, resolve_model
    from minivllm_lab.baselines import hf_model_for
    source = resolve_model("mistral-7b")
    model = build_model(source.config, "cuda", torch.bfloat16, 256, source.folder)
    ids = torch.randint(100, 32000, (1,), device="cuda")

    def ours():
        with torch.inference_mode():
            meta = NoCacheMetadata(torch.tensor([0, 1], device="cuda", dtype=torch.int32), 1)
            model.compute_logits(model(ids, torch.arange(1, device="cuda"), meta))
    result = {"minivllm": {"wall_ms": wall_ms(ours), **launch_count(ours)}}
    model = None  # the 7B weights go before transformers' copy comes
    torch.cuda.empty_cache()
    hf = hf_model_for(source, "cuda", torch.bfloat16)

    def theirs():
        with torch.inference_mode():
            hf(input_ids=ids[None], use_cache=False, logits_to_keep=1)
    result["transformers"] = {"wall_ms": wall_ms(theirs), **launch_count(theirs)}
    hf = None
    torch.cuda.empty_cache()
    return result


def fill_part(tokenizer_dir: Path) -> list[dict]:
    """The bitmask fill alone on this host's CPU: xgrammar's batch matcher on 1, 2, 4, 8 threads and 'auto'
    (half the cores), for 16 to 256 rows that are inside a JSON string (as most steps of the W1 runs are),
    while torch's CPU threads have just run (as between the engine's steps)."""
    import xgrammar as xgr
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=49152)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA_400), any_whitespace=False)
    prefix = tokenizer.encode('{"answer": "It was a long day', add_special_tokens=False)
    rows = []
    for batch in (16, 64, 128, 256):
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
        for m in matchers:
            assert all(m.accept_token(t) for t in prefix)
        mask = torch.empty((batch, (49152 + 31) // 32), dtype=torch.int32, pin_memory=torch.cuda.is_available())
        work = torch.randn(256, 256)
        for threads in (1, 2, 4, 8, "auto"):
            batch_matcher = xgr.BatchGrammarMatcher(max_threads=threads)
            times = []
            for _ in range(40):
                work @ work  # torch's threads wake up, as the engine's small CPU ops do between fills
                start = time.perf_counter()
                batch_matcher.batch_fill_next_token_bitmask(matchers, mask)
                times.append((time.perf_counter() - start) * 1e3)
            row = {"rows": batch, "threads": threads, "fill_ms_median": round(statistics.median(times[5:]), 3),
                   "fill_ms_max": round(max(times[5:]), 3)}
            print(row, flush=True)
            rows.append(row)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--parts", default="fill,store_kv,forward_t1,structured")
    args = p.parse_args()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    result = {"hardware": gpu, "gpu": gpu, "torch": torch.__version__}
    for part in args.parts.split(","):
        start = time.perf_counter()
        try:
            if part == "structured":
                result[part] = structured_part(mistral_folder(args.tokenizer_dir))
            elif part == "fill":
                result[part] = fill_part(args.tokenizer_dir)
            elif part == "forward_t1":
                result[part] = forward_t1_part()
            else:
                result[part] = store_kv_launch_cost()
        except Exception as e:  # one part failing must not lose the others' numbers
            result[part] = {"error": repr(e)}
            print(part, "failed:", repr(e), flush=True)
        print(f"{part} took {time.perf_counter() - start:.0f} s", flush=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
