"""The one-minute tour: real text from a real model through minivllm, then naive vs minivllm.

    python -m minivllm_lab.demo

Uses SmolLM2-135M-Instruct (real weights, offline) on whatever device is there, so it runs
on a laptop. The speed table runs a small slice of the W1 workload through transformers
one request at a time, minivllm's model without a KV cache, and the minivllm engine.
"""
from __future__ import annotations

import os

import torch
from transformers.utils import logging as hf_logging

from minivllm import LLM, SamplingParams
from minivllm.models.loader import resolve_model

from .baselines import hf_model_for
from .bench import runners
from .bench.metrics import format_table, hardware_name
from .bench.workloads import w1


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # A 135M model's matmuls at batch 1 are too small to share between cores, and threads that wait for a
        # core another program holds make every token slower (a 2-core laptop under load: 4.2 tok/s with one
        # thread, 0.8 with two).
        torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    llm = LLM("smollm2-135m", max_model_len=512, num_kv_blocks=256)
    greedy = SamplingParams(temperature=0, max_tokens=24)
    print(f"SmolLM2-135M-Instruct on {hardware_name()}\n")
    for prompt in ["The capital of France is", "Three things to pack for a beach holiday:"]:
        print(f"> {prompt}{llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].text}\n")
    question = "What is the capital of France?"
    answer = llm.chat([{"role": "user", "content": question}], greedy, use_tqdm=False)[0].outputs[0].text
    print(f"[chat] user: {question}\n[chat] assistant: {answer}\n")

    work = w1(llm.llm_engine.model_config.vocab_size, num_requests=4, max_prompt=32, output_len=16)
    hf = hf_model_for(resolve_model("smollm2-135m"), device, llm.llm_engine.dtype)
    rows = [runners.run_hf_sequential(hf, work), runners.run_recompute(llm.llm_engine.model, work),
            runners.run_minivllm(llm, work)]
    print(f"A slice of W1 ({len(work.prompts)} requests x {work.max_tokens[0]} tokens) on {hardware_name()}:")
    print(format_table(rows, ["engine", "output_tokens", "wall_s", "output_tok_s"]))


if __name__ == "__main__":
    main()
