"""Every engine option, alone and combined, gives transformers' greedy tokens (float32, CPU):
block sizes 1 and 16, pools so small that sequences are preempted, step budgets so small that
prefills are chunked, shared prefixes in the prefix cache, sliding windows shorter than the
prompt, generation far past the window, contiguous cache and static batching, and the
Triton kernels in place of the torch reference attention; each with the CPU and the GPU overlapped
(async scheduling, the default) and without (the Triton kernels, slow in the interpreter, overlapped only)."""
import itertools

import pytest
from test_engine import hf_greedy, random_prompts

from minivllm import LLM, SamplingParams

N = 24  # new tokens per request


@pytest.fixture(scope="module")
def references(tiny_llama, tiny_mistral):
    """transformers' greedy tokens for a fixed prompt set, computed once per model."""
    shared = random_prompts(1, seed=99, low=40, high=41)[0]  # a 40-token "system prompt"
    prompts = random_prompts(4, seed=1, low=1, high=40) + [shared + p for p in random_prompts(3, seed=2, high=12)]
    refs = {}
    for name, (folder, hf) in {"llama": tiny_llama, "mistral": tiny_mistral}.items():
        refs[name] = (folder, prompts, [hf_greedy(hf, p, N) for p in prompts])
    return refs


OPTIONS = {
    "default": {},
    "block size 1": dict(block_size=1, num_kv_blocks=2000),
    "tiny pool (preemption)": dict(block_size=4, num_kv_blocks=20),  # 80 tokens: the longest request
    "tiny budget (chunked prefill)": dict(max_num_batched_tokens=7),
    "no prefix caching": dict(enable_prefix_caching=False),
    "no chunked prefill": dict(enable_chunked_prefill=False),
    "contiguous cache, static batching": dict(enable_paged_kv=False, enable_continuous_batching=False,
                                              enable_chunked_prefill=False, enable_prefix_caching=False,
                                              num_kv_blocks=4 * 80 // 16),
    "all squeezed": dict(block_size=1, num_kv_blocks=80, max_num_batched_tokens=5, max_num_seqs=3),
    # The fused Triton kernels (in Triton's interpreter on a CPU) instead of the torch reference.
    "triton kernels": dict(attention_backend="triton"),
    "triton kernels, tiny pool": dict(attention_backend="triton", block_size=4, num_kv_blocks=20),
    "triton kernels, tiny budget": dict(attention_backend="triton", max_num_batched_tokens=7),
}


# The Triton kernels run in Triton's slow interpreter on a CPU: with the overlap on only (the default). The
# overlap does not touch the kernels; every torch option runs both ways.
# The interpreter's tiny-pool and tiny-budget runs take about 20 s each: `-m extended` runs them (the scheduler's
# paths are the torch options' above, the kernels' are "triton kernels" and tests/test_kernel_*).
EXTENDED = ("triton kernels, tiny pool", "triton kernels, tiny budget")
CASES = [pytest.param(model, option, overlap, marks=pytest.mark.extended if option in EXTENDED else ())
         for model, option, overlap in itertools.product(["llama", "mistral"], OPTIONS, [True, False])
         if overlap or not option.startswith("triton")]


@pytest.mark.parametrize("model,option,overlap", CASES)
def test_greedy_equals_transformers(references, model, option, overlap):
    folder, prompts, refs = references[model]
    args = dict(max_model_len=80, block_size=16, num_kv_blocks=40, async_scheduling=overlap) | OPTIONS[option]
    llm = LLM(folder, **args)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == refs
    stats = llm.llm_engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    if option in ("tiny pool (preemption)", "triton kernels, tiny pool"):
        assert stats["num_preemptions"] > 0


@pytest.mark.parametrize("option", ["default", "tiny pool (preemption)", "tiny budget (chunked prefill)"])
def test_stops_while_a_step_is_in_flight_change_nothing(references, option):
    # Requests that end early (a stop token, a short max_tokens) finish while the next step already
    # holds them: overlapped or not, every request gets the same tokens, and no block leaks.
    folder, prompts, refs = references["llama"]
    params = [SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, stop_token_ids=[ref[3 + i]])
              if i % 2 else SamplingParams(temperature=0, max_tokens=2 + i, ignore_eos=True)
              for i, ref in enumerate(refs)]
    results = []
    for overlap in (True, False):
        args = dict(max_model_len=80, block_size=16, num_kv_blocks=40, async_scheduling=overlap) | OPTIONS[option]
        llm = LLM(folder, **args)
        results.append([(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in llm.generate(prompts, params)])
        stats = llm.llm_engine.get_stats()
        assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert results[0] == results[1]
    for (tokens, reason), ref, p in zip(results[0], refs, params):
        assert tokens == ref[:len(tokens)] and reason == ("stop" if p.stop_token_ids else "length")


def test_shared_prefix_is_computed_once(references):
    folder, prompts, refs = references["llama"]
    llm = LLM(folder, max_model_len=80, block_size=16, num_kv_blocks=40)
    params = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    first = llm.generate(prompts[4], params)   # computes the 40-token system prompt: 2 full blocks cached
    later = llm.generate(prompts[5:], params)  # each reuses those 2 blocks
    assert [o.outputs[0].token_ids for o in first + later] == refs[4:]
    assert llm.llm_engine.get_stats()["num_prefix_cache_hit_tokens"] == 2 * 32


@pytest.mark.parametrize("overlap", [True, False])
def test_a_prefix_is_shared_while_its_step_is_in_flight(references, overlap):
    # The first request's prompt fills the first step's budget; the others join at the next step, which
    # with the overlap is scheduled before the first step is done. They share its 2 full system-prompt
    # blocks all the same: blocks are named for the prefix cache when they are scheduled.
    folder, prompts, refs = references["llama"]
    llm = LLM(folder, max_model_len=80, block_size=16, num_kv_blocks=40, max_num_batched_tokens=len(prompts[4]),
              async_scheduling=overlap)
    outs = llm.generate(prompts[4:], SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == refs[4:]
    assert llm.llm_engine.get_stats()["num_prefix_cache_hit_tokens"] == 2 * 32


def test_fully_cached_prompt_still_gets_its_first_token(tiny_llama):
    folder, hf = tiny_llama
    llm = LLM(folder, max_model_len=80, block_size=4, num_kv_blocks=40)
    prompt = random_prompts(1, seed=5, low=16, high=17)[0]  # exactly 4 full blocks
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = llm.generate(prompt, params)[0].outputs[0].token_ids
    again = llm.generate(prompt, params)[0].outputs[0].token_ids
    assert first == again == hf_greedy(hf, prompt, 6)
    assert llm.llm_engine.get_stats()["num_prefix_cache_hit_tokens"] == 12  # the last block is recomputed


def test_sliding_window_memory_stops_growing(tiny_mistral):
    folder, hf = tiny_mistral  # window 7
    llm = LLM(folder, max_model_len=200, block_size=2, num_kv_blocks=100)
    engine = llm.llm_engine
    prompt = random_prompts(1, seed=8, low=30, high=31)[0]
    engine.add_request("w", prompt, SamplingParams(temperature=0, max_tokens=120, ignore_eos=True))
    held, tokens = [], []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = out.outputs[0].token_ids
        held.append(engine.get_stats()["num_total_blocks"] - engine.get_stats()["num_free_blocks"])
    assert max(held[2:-1]) <= 7 // 2 + 2  # window + one block (+ the partial block being written)
    assert tokens == hf_greedy(hf, prompt, 120)


def test_request_that_can_never_fit_is_refused(tiny_llama):
    llm = LLM(tiny_llama[0], max_model_len=80, block_size=4, num_kv_blocks=5)
    engine = llm.llm_engine
    engine.add_request("ok", [1, 2, 3], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    with pytest.raises(ValueError, match="could never run"):
        engine.add_request("huge", list(range(1, 30)), SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        outs = engine.step()
    assert outs[-1].request_id == "ok" and len(outs[-1].outputs[0].token_ids) == 8
    assert engine.get_stats()["num_free_blocks"] == 5


def test_abort_in_every_state_leaks_nothing(tiny_llama):
    llm = LLM(tiny_llama[0], max_model_len=80, block_size=4, num_kv_blocks=12, max_num_batched_tokens=6)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    for i, prompt in enumerate(random_prompts(5, seed=4, low=5, high=20)):
        engine.add_request(str(i), prompt, params)
    engine.step()
    engine.step()
    for rid in ("0", "2", "4"):  # running, mid-prefill or still waiting: whatever each is now
        engine.abort_request(rid)
    finished = set()
    while engine.has_unfinished_requests():
        finished |= {o.request_id for o in engine.step() if o.finished}
    assert finished == {"1", "3"}
    stats = engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_decodes_are_never_stalled_by_a_long_prompt(tiny_llama):
    """Chunked prefill: while a long prompt is prefilled, a running request still gets a token every step."""
    llm = LLM(tiny_llama[0], max_model_len=200, block_size=4, num_kv_blocks=100, max_num_batched_tokens=8)
    engine = llm.llm_engine
    engine.add_request("chat", [5, 6, 7], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    engine.step()
    engine.add_request("long", list(range(1, 121)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    for _ in range(15):  # 120 prompt tokens at most 7 per step alongside the decode
        assert "chat" in {o.request_id for o in engine.step()}
