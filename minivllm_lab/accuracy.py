"""What quantization costs in accuracy, measured teacher-forced on a text that ships with the project.

The model reads the text once (prompt logprobs, no sampling); at every position we keep its top-1 next token
and the log-probability it gives the text's real next token. Two models agree where their top-1 tokens match;
the perplexity is exp(-mean log-probability). Notebook 17 and tests/test_quantization.py gate on both.

    >>> gates = quantization_gates("smollm2-135m")          # {"fp8": {"top1_agreement": ..., ...}, ...}
"""
from __future__ import annotations

import math
from pathlib import Path

from minivllm import LLM, SamplingParams

GATES_TEXT = Path(__file__).parent / "data" / "gates_text.txt"
# (quantization, kv_cache_dtype) of each configuration the gates check, by name.
CONFIGS = {"fp8": ("fp8", "auto"), "int8": ("int8", "auto"), "fp8 KV": (None, "fp8"), "fp8 + fp8 KV": ("fp8", "fp8")}


def teacher_forced(llm: LLM, token_ids: list[int]) -> tuple[list[int], list[float]]:
    """Per position 1 .. n-1: the model's top-1 token, and the log-probability of the text's token there."""
    out = llm.generate([token_ids], SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False)[0]
    top1, logprobs = [], []
    for token, position in zip(token_ids[1:], out.prompt_logprobs[1:]):
        top1.append(max(position, key=lambda t: position[t].logprob))  # the top 1 and the text's token
        logprobs.append(position[token].logprob)
    return top1, logprobs


def agreement(top1: list[int], ref_top1: list[int]) -> float:
    """The share of positions where two models' top-1 tokens match."""
    return sum(a == b for a, b in zip(top1, ref_top1)) / len(top1)


def perplexity(logprobs: list[float]) -> float:
    return math.exp(-sum(logprobs) / len(logprobs))


def quantization_gates(model: str = "smollm2-135m", text: str | None = None, configs=CONFIGS,
                       **engine_args) -> dict[str, dict[str, float]]:
    """Top-1 agreement with the unquantized model and perplexity change, per configuration (and the baseline's
    perplexity under "auto")."""
    engine_args = {"max_model_len": 1024, "num_kv_blocks": 128, **engine_args}
    baseline = LLM(model, **engine_args)
    token_ids = baseline.tokenizer.encode(text if text is not None else GATES_TEXT.read_text())
    ref_top1, ref_logprobs = teacher_forced(baseline, token_ids)
    ref_ppl = perplexity(ref_logprobs)
    results = {"auto": {"top1_agreement": 1.0, "perplexity": ref_ppl, "perplexity_change": 0.0,
                        "positions": len(ref_top1)}}
    for name, (quantization, kv_cache_dtype) in configs.items():
        llm = LLM(model, quantization=quantization, kv_cache_dtype=kv_cache_dtype, **engine_args)
        top1, logprobs = teacher_forced(llm, token_ids)
        ppl = perplexity(logprobs)
        results[name] = {"top1_agreement": agreement(top1, ref_top1),
                         "perplexity": ppl, "perplexity_change": ppl / ref_ppl - 1, "positions": len(top1)}
    return results


def main(argv=None) -> dict:
    """The gates on SmolLM2 (float32 on a CPU), and bfloat16 without quantization against the same reference: the
    agreement that rounding the activations alone costs."""
    import argparse

    from .bench.metrics import hardware_name, save_json, source_commit
    parser = argparse.ArgumentParser(description="quantization's accuracy gates, teacher-forced on SmolLM2")
    parser.add_argument("--out", default="bench-results/17_accuracy.json")
    args = parser.parse_args(argv)
    gates = quantization_gates("smollm2-135m", dtype="float32", device="cpu")
    reference = LLM("smollm2-135m", dtype="float32", device="cpu", max_model_len=1024, num_kv_blocks=128)
    token_ids = reference.tokenizer.encode(GATES_TEXT.read_text())
    ref_top1, ref_logprobs = teacher_forced(reference, token_ids)
    bf16 = LLM("smollm2-135m", dtype="bfloat16", device="cpu", max_model_len=1024, num_kv_blocks=128)
    top1, logprobs = teacher_forced(bf16, token_ids)
    gates["bfloat16, unquantized"] = {
        "top1_agreement": agreement(top1, ref_top1),
        "perplexity": perplexity(logprobs), "perplexity_change": perplexity(logprobs) / perplexity(ref_logprobs) - 1,
        "positions": len(top1)}
    result = {"hardware": hardware_name("cpu"), "commit": source_commit(), "model": "smollm2-135m (float32 reference)",
              "command": "python -m minivllm_lab.accuracy", "text": GATES_TEXT.name, "gates": gates}
    save_json(args.out, result)
    for name, row in gates.items():
        print(f"{name:>22}: top-1 agreement {row['top1_agreement']:.3f}, perplexity {row['perplexity']:.3f} "
              f"({100 * row['perplexity_change']:+.2f}%)")
    return result


if __name__ == "__main__":
    main()
