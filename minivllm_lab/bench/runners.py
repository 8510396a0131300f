"""Run one engine on one workload and return what it did, in the same shape for every engine.

    >>> w = w1(vocab_size=32000)
    >>> row = run_minivllm(llm, w)           # {"engine": "minivllm", "output_tok_s": ..., "ttft_p50_s": ...}
    >>> row = run_hf_static(hf_model, w)     # same keys where they make sense

Every runner produces exactly `max_tokens` tokens per request (ignore_eos), warms up
first (kernel compilation and selection and allocator growth are not what we measure),
and times the whole run with a synchronising timer.
"""
from __future__ import annotations

from minivllm.sampling_params import SamplingParams

from .. import baselines
from .metrics import Timer, summarize
from .workloads import Workload


def _row(engine: str, w: Workload, output_tokens: int, wall_s: float, **extra) -> dict:
    return {"engine": engine, "workload": w.name, "num_requests": len(w.prompts),
            "output_tokens": output_tokens, "wall_s": wall_s, "output_tok_s": output_tokens / wall_s, **extra}


def _warm_up(generate) -> None:
    generate([[1, 2, 3, 4]], 2)


def run_minivllm(llm, w: Workload, use_tqdm: bool = False, engine: str = "minivllm") -> dict:
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in w.max_tokens]
    # Warm up on the workload's own shapes (its prompts with every id shifted, so the prefix cache
    # holds nothing the timed run could reuse, and 3 tokens each): Triton compiles a kernel variant
    # per new shape class, and that should happen here, not in the timed run.
    vocab = llm.llm_engine.model_config.vocab_size
    llm.generate([[(t + 1) % vocab for t in p] for p in w.prompts],
                 SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    with Timer() as t:
        outputs = llm.generate(w.prompts, params, use_tqdm=use_tqdm)
    stats = summarize(outputs, wall_time_s=t.elapsed_s)
    stats["num_preemptions"] = llm.llm_engine.get_stats()["num_preemptions"]
    return {"engine": engine, "workload": w.name, **stats}


def _same_length(w: Workload) -> int:
    if len(set(w.max_tokens)) != 1:
        raise ValueError("this baseline generates the same number of tokens for every request")
    return w.max_tokens[0]


def _run_baseline(engine: str, w: Workload, generate, per_request_lengths: bool = False) -> dict:
    """Time `generate(prompts, max_tokens) -> new token ids` on the whole workload, after a warm-up."""
    n = list(w.max_tokens) if per_request_lengths else _same_length(w)
    _warm_up(generate)
    with Timer() as t:
        outs = generate(w.prompts, n)
    return _row(engine, w, sum(map(len, outs)), t.elapsed_s)


def run_recompute(model, w: Workload) -> dict:
    return _run_baseline("minivllm recompute (no cache)", w,
                         lambda p, n: baselines.recompute_generate(model, p, n))


def run_hf_sequential(hf_model, w: Workload) -> dict:
    n = _same_length(w)
    _warm_up(lambda p, k: baselines.hf_generate_sequential(hf_model, p, k))
    e2e = []
    for prompt in w.prompts:
        with Timer() as t:
            baselines.hf_generate_sequential(hf_model, [prompt], n)
        e2e.append(t.elapsed_s)
    return _row("transformers one at a time", w, n * len(w.prompts), sum(e2e), e2e_mean_s=sum(e2e) / len(e2e))


def run_hf_static(hf_model, w: Workload, batch_size: int | None = None) -> dict:
    return _run_baseline("transformers static batch", w, lambda p, n: baselines.hf_generate_static_batch(
        hf_model, p, n, batch_size or len(p)))


def run_hf_continuous(hf_model, w: Workload) -> dict:
    return _run_baseline("transformers continuous batching", w,
                         lambda p, n: baselines.hf_generate_continuous(hf_model, p, n), per_request_lengths=True)
