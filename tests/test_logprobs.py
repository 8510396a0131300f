"""Logprobs and prompt logprobs equal log_softmax of transformers' logits (float32, CPU).

The reference is written here: transformers' forward over the whole sequence (prompt + answer), its
log_softmax at each position, the chosen token's logprob and rank and the top N. Checked with the CPU
and the GPU overlapped or not, with chunked prefill cutting the prompts, with penalties on (logprobs are
vLLM's raw ones: from the model's logits before any processing), and with a speculative proposer.
"""
import msgspec
import pytest
import torch
from test_engine import random_prompts

from minivllm import LLM, SamplingParams
from minivllm.engine.core_messages import EngineCoreRequest

N = 8
TOP = 5


@torch.no_grad()
def reference(hf, tokens):
    """log_softmax [len(tokens), V] of transformers' logits: row p predicts token p + 1."""
    return hf(torch.tensor([tokens])).logits[0].float().log_softmax(-1)


def check_position(got: dict, row: torch.Tensor, chosen: int, n: int):
    assert next(iter(got)) == chosen  # the chosen token first
    assert got[chosen].logprob == pytest.approx(row[chosen].item(), abs=1e-4)
    assert got[chosen].rank == int((row >= row[chosen]).sum())
    top = row.topk(n).indices.tolist()
    assert set(got) == {chosen, *top}
    for r, t in enumerate(top, 1):
        assert got[t].logprob == pytest.approx(row[t].item(), abs=1e-4)
        if t != chosen:
            assert got[t].rank == r


@pytest.mark.parametrize("engine_args", [dict(), dict(async_scheduling=False),
                                         dict(max_num_batched_tokens=16),  # chunks of the prompts
                                         dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2})])
def test_logprobs_equal_transformers(tiny_llama, engine_args):
    folder, hf = tiny_llama
    prompts = random_prompts(3, seed=21, low=5)
    llm = LLM(folder, max_model_len=80, num_kv_blocks=40, **engine_args)
    params = [SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, logprobs=TOP, prompt_logprobs=2),
              SamplingParams(temperature=0, max_tokens=N, ignore_eos=True),   # a batch-mate that asks nothing
              SamplingParams(temperature=0.8, seed=3, max_tokens=N, ignore_eos=True, logprobs=0,
                             repetition_penalty=1.5)]  # raw logprobs: before the penalty and the temperature
    outs = llm.generate(prompts, params, use_tqdm=False)
    for out, p in zip(outs, params):
        answer = out.outputs[0]
        if p.logprobs is None:
            assert answer.logprobs is None and out.prompt_logprobs is None
            continue
        ref = reference(hf, out.prompt_token_ids + answer.token_ids)
        assert len(answer.logprobs) == len(answer.token_ids) == N
        start = len(out.prompt_token_ids) - 1
        for i, (token, got) in enumerate(zip(answer.token_ids, answer.logprobs)):
            check_position(got, ref[start + i], token, p.logprobs)
        if p.prompt_logprobs is not None:
            assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(out.prompt_token_ids)
            for pos, got in enumerate(out.prompt_logprobs[1:]):
                check_position(got, ref[pos], out.prompt_token_ids[pos + 1], p.prompt_logprobs)
        else:
            assert out.prompt_logprobs is None
    stats = llm.llm_engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_prompt_logprobs_with_prefix_caching_and_preemption(tiny_llama):
    """A prompt whose blocks are cached is still scored at every position; a preempted request that
    re-prefills does not score its prompt twice."""
    folder, hf = tiny_llama
    prompt = random_prompts(1, seed=4, low=30)[0]
    llm = LLM(folder, max_model_len=80, num_kv_blocks=8, block_size=8, max_num_seqs=4)
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)  # caches its blocks
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, prompt_logprobs=1, logprobs=1)
    outs = llm.generate([prompt, prompt[:20], prompt[5:25]], params, use_tqdm=False)
    assert llm.llm_engine.get_stats()["num_preemptions"] > 0
    for out in outs:
        ref = reference(hf, out.prompt_token_ids + out.outputs[0].token_ids)
        assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
        for pos, got in enumerate(out.prompt_logprobs[1:]):
            check_position(got, ref[pos], out.prompt_token_ids[pos + 1], 1)
        assert len(out.outputs[0].logprobs) == 24


@pytest.mark.parametrize("name", ["logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("value", [-1, 21, 2.0, True, "3", [1]])
def test_bad_logprobs_values_are_value_errors(name, value):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: value})


def test_logprobs_cross_the_wire():
    params = SamplingParams(logprobs=3)
    wire = msgspec.msgpack.encode(EngineCoreRequest("r", [1, 2], params))
    assert msgspec.msgpack.decode(wire, type=EngineCoreRequest).sampling_params.logprobs == 3


@pytest.mark.parametrize("engine_core_process", [True, False])
def test_async_llm_streams_the_same_logprobs(tiny_llama, engine_core_process):
    """Through the engine core in a process (arrays on the wire) and in a thread: the offline logprobs."""
    import asyncio

    from minivllm import AsyncLLM
    folder, _ = tiny_llama
    args = dict(max_model_len=80, num_kv_blocks=40)
    prompts = random_prompts(2, seed=8, low=3)
    params = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, logprobs=3)
    offline = LLM(folder, **args).generate(prompts, params, use_tqdm=False)
    engine = AsyncLLM(folder, engine_core_process=engine_core_process, **args)
    try:
        async def run(prompt):
            return [out async for out in engine.generate(prompt, params)]

        async def main():
            streams = await asyncio.gather(*[run(p) for p in prompts])
            with pytest.raises(ValueError, match="prompt_logprobs"):
                await engine.add_request("x", prompts[0], SamplingParams(prompt_logprobs=1))
            return streams

        streams = asyncio.run(main())
    finally:
        engine.shutdown()
    for outs, ref in zip(streams, offline):
        for out in outs:  # cumulative: one dict per token so far
            assert len(out.outputs[0].logprobs) == len(out.outputs[0].token_ids)
        got, want = outs[-1].outputs[0].logprobs, ref.outputs[0].logprobs
        # The same tokens and ranks; the values to float32 rounding (the core's process may run its matmuls
        # with another number of threads, which sums in another order).
        assert [{t: lp.rank for t, lp in d.items()} for d in got] == [{t: lp.rank for t, lp in d.items()} for d in want]
        for g, w in zip(got, want):
            assert [lp.logprob for lp in g.values()] == pytest.approx([lp.logprob for lp in w.values()], abs=1e-4)
