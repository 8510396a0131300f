"""n > 1 (parallel sampling): n requests in the core, one per completion, that share the prompt's full blocks.

Each completion equals what its seed (seed + i) gives alone; the full prompt blocks are computed once and
held once (the prefix cache), each completion computing only the prompt's partial last block; preemption
(a tiny pool), chunked prefill, prefix caching and an abort leak no block.
"""
import pytest
from test_engine import random_prompts

from minivllm import LLM, SamplingParams
from minivllm.core.block_manager import cdiv
from minivllm_lab.bench import parallel_sampling

P, T, BS = 37, 8, 8  # the prompt's last block is partial: each completion computes it


def run(llm, prompts, params):
    """(final outputs, peak blocks in use, prompt tokens computed), and no block or request left behind."""
    result = parallel_sampling.run(llm, prompts, params)
    stats = llm.llm_engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not llm.llm_engine.requests
    return result["outputs"], result["peak_blocks"], result["prefill_tokens"]


def sampled(seed, n=1, **kw):
    return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=T, ignore_eos=True, **kw)


@pytest.mark.parametrize("engine_args", [dict(), dict(async_scheduling=False), dict(max_num_batched_tokens=16)])
def test_n_shares_the_prompt_and_each_answer_equals_its_seed_alone(tiny_llama, engine_args):
    prompt = random_prompts(1, seed=3, low=P, high=P + 1)[0]
    llm = LLM(tiny_llama[0], max_model_len=80, num_kv_blocks=40, block_size=BS, **engine_args)
    [out], peak, prefill = run(llm, [prompt], [sampled(11, n=4, logprobs=0)])
    alone, peak_alone, prefill_alone = run(llm, [prompt] * 4, [sampled(11 + i, logprobs=0) for i in range(4)])
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert [c.token_ids for c in out.outputs] == [a.outputs[0].token_ids for a in alone]
    # The same logits too: every completion read the right keys and values (shared blocks, its own).
    for c, a in zip(out.outputs, alone):
        assert [d[t].logprob for d, t in zip(c.logprobs, c.token_ids)] == \
               pytest.approx([d[t].logprob for d, t in zip(a.outputs[0].logprobs, c.token_ids)], abs=1e-5)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # temperature 1: different answers
    # KV written per answer: the prompt and all its tokens but the last (never fed back).
    own = cdiv(P + T - 1, BS) - P // BS
    if "max_num_batched_tokens" in engine_args:  # chunks of 16: completions join as blocks get cached
        assert P + 3 * (P % BS) <= prefill < 4 * P and peak < 4 * cdiv(P + T - 1, BS)
    else:  # the full prompt blocks computed and held once; the partial one by each completion
        assert (peak, prefill) == (P // BS + 4 * own, P + 3 * (P % BS))
        # n > 1 is n requests sharing the prefix cache: the same blocks as 4 separate requests (which find the
        # prompt's full blocks cached by the run above)
        assert (peak_alone, prefill_alone) == (peak, 4 * (P % BS))


def test_n_with_preemption_prefix_caching_and_logprobs(tiny_llama):
    """A pool too small for everyone: answers are preempted and recomputed alone, same tokens."""
    prompts = random_prompts(3, seed=6, low=20, high=30)
    params = [sampled(5, n=3, logprobs=1), sampled(9, n=2), sampled(1)]
    llm = LLM(tiny_llama[0], max_model_len=80, num_kv_blocks=12, block_size=4, max_num_seqs=8)
    outs, _, _ = run(llm, prompts, params)
    assert llm.llm_engine.get_stats()["num_preemptions"] > 0
    for out, p, sp in zip(outs, prompts, params):
        assert len(out.outputs) == sp.n
        for c in out.outputs:
            alone = llm.generate([p], sampled(sp.seed + c.index, logprobs=sp.logprobs), use_tqdm=False)[0].outputs[0]
            assert c.token_ids == alone.token_ids
            if sp.logprobs is not None:
                assert [list(d) for d in c.logprobs] == [list(d) for d in alone.logprobs]


def test_abort_ends_all_answers_and_frees_every_block(tiny_llama):
    llm = LLM(tiny_llama[0], max_model_len=80, num_kv_blocks=40, block_size=BS)
    engine = llm.llm_engine
    engine.add_request("a", random_prompts(1, seed=2, low=P, high=P + 1)[0],
                       SamplingParams(n=4, temperature=1.0, max_tokens=40, ignore_eos=True))
    for _ in range(4):
        engine.step()
    out = engine.abort_request("a")
    assert out.finished and [c.finish_reason for c in out.outputs] == ["abort"] * 4
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()  # (a step still in flight)
    stats = engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and not engine.requests


@pytest.mark.parametrize("value", [0, -1, 257, 2.0, True, "2", None])
def test_bad_n_is_a_value_error(value):
    with pytest.raises(ValueError, match="n "):
        SamplingParams(n=value)


def test_n_above_max_num_seqs_is_refused(tiny_llama):
    llm = LLM(tiny_llama[0], max_model_len=80, num_kv_blocks=40, max_num_seqs=4)
    with pytest.raises(ValueError, match="max_num_seqs"):
        llm.generate([[1, 2, 3]], SamplingParams(n=5), use_tqdm=False)


@pytest.mark.parametrize("engine_core_process", [True, False])
def test_async_llm_n_equals_the_offline_engine_and_an_abort_frees_everything(tiny_llama, engine_core_process):
    import asyncio

    from minivllm import AsyncLLM
    args = dict(max_model_len=80, num_kv_blocks=40, block_size=BS, max_num_seqs=8)
    prompt = random_prompts(1, seed=3, low=P, high=P + 1)[0]
    params = sampled(4, n=3, logprobs=2)
    offline = LLM(tiny_llama[0], **args).generate([prompt], params, use_tqdm=False)[0]
    engine = AsyncLLM(tiny_llama[0], engine_core_process=engine_core_process, **args)
    try:
        async def main():
            outs = [out async for out in engine.generate(prompt, params)]
            long = SamplingParams(n=4, temperature=1.0, max_tokens=60, ignore_eos=True)
            async for out in engine.generate(prompt, long):  # a reader that leaves mid-stream aborts all 4
                if len(out.outputs[0].token_ids) >= 3:
                    break
            with pytest.raises(ValueError, match="max_num_seqs"):
                await engine.add_request("x", prompt, SamplingParams(n=9))
            for _ in range(500):
                stats = engine.get_stats()
                if stats["num_running"] == stats["num_waiting"] == 0 and not engine.requests:
                    return outs, stats
                await asyncio.sleep(0.01)
            raise AssertionError(engine.get_stats())

        outs, stats = asyncio.run(main())
    finally:
        engine.shutdown()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    final = outs[-1]
    assert final.finished and not any(o.finished for o in outs[:-1])
    assert [c.token_ids for c in final.outputs] == [c.token_ids for c in offline.outputs]
    assert [[list(d) for d in c.logprobs] for c in final.outputs] == \
           [[list(d) for d in c.logprobs] for c in offline.outputs]
