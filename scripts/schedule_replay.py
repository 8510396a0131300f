"""Replay a workload through minivllm's scheduler on the CPU, with the model's forward left out.

Two questions need no GPU: how many steps a workload takes under some engine options (and how big
its batches are), and how much time the CPU's part of a step costs (scheduling, `prepare()`, the
bookkeeping of the outputs), the part that runs while the GPU waits. The forward is replaced by
a single zero logit per sequence, so every request produces token 0 until its `max_tokens`; the schedule is that of
the real engine, since W1 and W2 ignore end-of-sequence.

    python scripts/schedule_replay.py --workload w1 --static     # steps of W1 with static batching
    python scripts/schedule_replay.py --workload w2               # CPU ms per step on W2
"""
import argparse
import tempfile
import time

import torch

from minivllm import LLM, SamplingParams
from minivllm_lab.bench.workloads import w1, w2


def tiny_checkpoint() -> str:
    """A 1-layer random Llama with a 32,000-token vocabulary (Mistral's), written by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM
    folder = tempfile.mkdtemp(prefix="minivllm-replay-")
    LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=4096)).save_pretrained(folder)
    return folder


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["w1", "w2"], default="w1")
    parser.add_argument("--static", action="store_true", help="enable_continuous_batching=False")
    args = parser.parse_args()
    work = {"w1": w1, "w2": w2}[args.workload](32000)
    max_len = max(len(p) + n for p, n in zip(work.prompts, work.max_tokens))
    llm = LLM(tiny_checkpoint(), max_model_len=max_len, max_num_seqs=min(256, len(work.prompts)),
              num_kv_blocks=len(work.prompts) * (max_len // 16 + 1), enable_continuous_batching=not args.static)
    engine, runner = llm.llm_engine, llm.llm_engine.runner
    batches = []

    def run_without_model(scheduler_output):
        runner.prepare(scheduler_output)  # the step's inputs are still built: that is CPU work
        batches.append((len(scheduler_output.seqs), not scheduler_output.prefills))
        # one logit per sampling row: greedy picks token 0, at no cost
        return torch.zeros(len(scheduler_output.sampled_seqs), 1)

    runner.execute_model = run_without_model
    for i, (prompt, n) in enumerate(zip(work.prompts, work.max_tokens)):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    step_ms = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        step_ms.append(1e3 * (time.perf_counter() - start))
    sizes = [b for b, _ in batches]
    full = [ms for ms, b in zip(step_ms, sizes) if b == max(sizes)]
    print(f"{work.name}{' (static batching)' if args.static else ''}: {len(batches)} steps "
          f"({sum(decode for _, decode in batches)} decode-only); batch of {sizes[0]} at the first step, "
          f"{max(sizes)} at most, {sum(sizes) / len(sizes):.1f} on average")
    print(f"CPU time without the model: {sum(step_ms) / 1e3:.2f} s in all, "
          f"{sorted(full)[len(full) // 2]:.2f} ms per step (median) at the largest batch, {max(sizes)}")

if __name__ == "__main__":
    main()
