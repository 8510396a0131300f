"""Speculative decoding: the same greedy tokens as without it (and as transformers) under every engine option,
the guesses' slots given back, seeds that reproduce, and bad configurations refused.

The tiny random models repeat themselves after a few tokens, so the n-gram proposer finds guesses and some
are kept: each case also checks that guesses were made and that some were kept, or it would test nothing.
"""
import pytest
from test_engine_options import OPTIONS, references  # noqa: F401  (a fixture)

from minivllm import LLM, SamplingParams
from minivllm.spec_decode import NgramProposer

N = 24
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SPEC_OPTIONS = ["default", "block size 1", "tiny pool (preemption)", "tiny budget (chunked prefill)",
                "no prefix caching", "all squeezed", "triton kernels"]


def assert_nothing_leaked(llm):
    stats = llm.llm_engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert not llm.llm_engine.requests


@pytest.mark.parametrize("model", ["llama", "mistral"])
@pytest.mark.parametrize("option", SPEC_OPTIONS)
def test_ngram_greedy_equals_transformers(references, model, option):  # noqa: F811
    folder, prompts, refs = references[model]
    args = dict(max_model_len=80, block_size=16, num_kv_blocks=40) | OPTIONS[option]
    llm = LLM(folder, speculative_config=NGRAM, **args)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == refs
    stats = llm.llm_engine.get_stats()
    assert stats["num_draft_tokens"] > 0 and 0 < stats["num_accepted_tokens"] <= stats["num_draft_tokens"]
    assert_nothing_leaked(llm)


@pytest.mark.parametrize("draft", ["itself", "another model"])
def test_draft_model_greedy_equals_transformers(references, tiny_llama, tmp_path, draft):  # noqa: F811
    folder, prompts, refs = references["llama"]
    if draft == "itself":
        draft_folder = folder
    else:  # a different random model with the same vocabulary: fewer guesses kept, the same tokens
        from conftest import make_checkpoint
        draft_folder, _ = make_checkpoint(tmp_path / "draft", num_hidden_layers=1, seed=7)
    spec = {"method": "draft_model", "model": draft_folder, "num_speculative_tokens": 4}
    llm = LLM(folder, max_model_len=80, block_size=4, num_kv_blocks=60, speculative_config=spec)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == refs
    stats = llm.llm_engine.get_stats()
    assert stats["num_draft_tokens"] > 0
    if draft == "itself":  # the draft guesses what the target picks: every guess is kept
        assert stats["num_accepted_tokens"] == stats["num_draft_tokens"]
    else:
        assert stats["num_accepted_tokens"] < stats["num_draft_tokens"]
    assert_nothing_leaked(llm)


def test_sampling_with_a_seed_reproduces_and_stays_in_the_vocabulary(tiny_llama):
    folder, _ = tiny_llama
    params = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, ignore_eos=True, seed=s) for s in range(4)]
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 3], [9] * 10, [4, 8, 15, 16, 23, 42]]
    runs = []
    for _ in range(2):
        llm = LLM(folder, max_model_len=80, num_kv_blocks=40, speculative_config=NGRAM)
        runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
        assert_nothing_leaked(llm)
    assert runs[0] == runs[1]
    assert all(len(t) == 20 and all(0 <= x < 211 for x in t) for t in runs[0])


def test_guesses_stop_at_max_tokens_and_max_model_len(tiny_llama):
    folder, _ = tiny_llama
    llm = LLM(folder, max_model_len=40, num_kv_blocks=20, speculative_config=NGRAM)
    outs = llm.generate([[3, 4] * 10, [3, 4] * 5], [SamplingParams(temperature=0, max_tokens=100, ignore_eos=True),
                                                     SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)],
                        use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == 20 and outs[0].outputs[0].finish_reason == "length"
    assert len(outs[1].outputs[0].token_ids) == 7
    assert_nothing_leaked(llm)


def test_a_stop_token_inside_the_kept_guesses_ends_the_answer_there(tiny_llama):
    folder, _ = tiny_llama
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6]
    plain = LLM(folder, max_model_len=80, num_kv_blocks=40)
    reference = plain.generate([prompt], SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))[0]
    stop = reference.outputs[0].token_ids[N // 2]
    params = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, stop_token_ids=[stop])
    expected = plain.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    spec = LLM(folder, max_model_len=80, num_kv_blocks=40, speculative_config=NGRAM)
    got = spec.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert got.token_ids == expected and got.token_ids[-1] == stop and got.finish_reason == "stop"
    assert_nothing_leaked(spec)


def test_blocks_named_for_the_prefix_cache_hold_only_verified_tokens(tiny_llama):
    """After every step, each block a running sequence has named for the prefix cache holds exactly that
    sequence's tokens, all of them computed: never a guess that was not kept."""
    folder, _ = tiny_llama
    llm = LLM(folder, max_model_len=80, num_kv_blocks=60, block_size=2, speculative_config=NGRAM)
    engine, checked = llm.llm_engine, 0
    for i, prompt in enumerate([[5, 6, 7] * 5, [8, 9] * 6, [3, 4, 5, 6] * 3]):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    blocks = engine.block_manager
    while engine.has_unfinished_requests():
        engine.step()
        for seq in engine.scheduler.running:
            for i in range(seq.num_cached_blocks):
                block = blocks.blocks[seq.block_table[i]]
                assert (i + 1) * blocks.block_size <= seq.num_computed_tokens <= len(seq)
                assert block.tokens == tuple(seq.token_ids[i * blocks.block_size:(i + 1) * blocks.block_size])
                checked += 1
    assert checked > 0 and engine.get_stats()["num_accepted_tokens"] < engine.get_stats()["num_draft_tokens"]
    assert_nothing_leaked(llm)


def test_abort_mid_generation_gives_every_block_back(tiny_llama):
    folder, _ = tiny_llama
    llm = LLM(folder, max_model_len=80, num_kv_blocks=40, block_size=4, speculative_config=NGRAM)
    engine = llm.llm_engine
    for i in range(4):
        engine.add_request(str(i), [5, 6, 7] * 4, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for _ in range(3):
        engine.step()
    for i in range(4):
        engine.abort_request(str(i))
    assert_nothing_leaked(llm)


def test_no_guesses_from_the_batch_size_named_on(tiny_llama):
    folder, _ = tiny_llama
    spec = NGRAM | {"disable_by_batch_size": 2}
    llm = LLM(folder, max_model_len=80, num_kv_blocks=40, speculative_config=spec)
    llm.generate([[5, 6, 7] * 4] * 3, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert llm.llm_engine.get_stats()["num_draft_tokens"] == 0  # three running: no guesses
    llm.generate([[5, 6, 7] * 4], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    assert llm.llm_engine.get_stats()["num_draft_tokens"] > 0   # one running: guesses


def test_ngram_proposer_takes_the_longest_latest_match():
    proposer = NgramProposer(1, 3)
    assert proposer.propose_for([5, 6, 7, 8, 5, 6], k=2) == [7, 8]
    assert proposer.propose_for([1, 2, 9, 1, 2, 3, 7, 2, 3], k=2) == [7, 2]     # "2 3" beats "3" alone
    assert proposer.propose_for([1, 2, 3], k=2) == []
    assert NgramProposer(2, 3).propose_for([1, 2, 3, 2], k=2) == []              # a 1-token match is too short


@pytest.mark.parametrize("spec,match", [
    ({"method": "medusa", "num_speculative_tokens": 2}, "method"),
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "min"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
    ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "unknown"),
    ({"method": "ngram", "num_speculative_tokens": 2, "adaptive": "yes"}, "adaptive"),
    ("ngram", "dict"),
])
def test_bad_speculative_configs_are_refused(tiny_llama, spec, match):
    with pytest.raises(ValueError, match=match):
        LLM(tiny_llama[0], num_kv_blocks=8, speculative_config=spec)


def test_a_draft_with_another_vocabulary_is_refused(tiny_llama, tmp_path):
    from conftest import make_checkpoint
    draft, _ = make_checkpoint(tmp_path / "draft", vocab_size=100)
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(tiny_llama[0], num_kv_blocks=8, speculative_config={"method": "draft_model", "model": draft,
                                                                  "num_speculative_tokens": 2})


@pytest.mark.slow
def test_the_server_speculates_with_the_same_answers_and_reports_it(tmp_path):
    """`minivllm serve --speculative-config JSON` (the engine core in its own process): the same greedy text as
    the offline engine without speculation, streamed or whole, and the spec-decode counters in /metrics.
    A word tokenizer (token i is the word "w<i>") and random weights drawn from the same seed on both sides."""
    import json

    import httpx
    import openai
    from server_utils import running_server
    from test_engine_core import TINY_WORDS

    from minivllm_lab.bench.word_model import write_word_model

    folder = str(write_word_model(tmp_path / "words", TINY_WORDS))
    prompts = ["w5 w6 w7 w5 w6 w7 w5 w6", "w9 w10 w11 w12 w9 w10"]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    offline = LLM(folder, load_format="dummy", max_model_len=80, num_kv_blocks=40)
    expected = [o.outputs[0].text for o in offline.generate(prompts, greedy, use_tqdm=False)]
    with running_server(folder, "--max-model-len", "80", "--num-kv-blocks", "40", "--load-format", "dummy",
                        "--speculative-config", json.dumps(NGRAM), served_model_name="tiny") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        for prompt, text in zip(prompts, expected):
            whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0,
                                              extra_body={"ignore_eos": True})
            assert whole.choices[0].text == text
            stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
            assert "".join(c.choices[0].text for c in stream if c.choices) == text
        metrics = httpx.get(url + "/metrics").text
        values = {line.split("{")[0]: float(line.split()[-1]) for line in metrics.splitlines()
                  if line.startswith("minivllm:spec_decode")}
        assert values["minivllm:spec_decode_num_draft_tokens_total"] > 0
        assert 0 < values["minivllm:spec_decode_num_accepted_tokens_total"] <= \
            values["minivllm:spec_decode_num_draft_tokens_total"]
        assert values["minivllm:spec_decode_mean_acceptance_length"] > 1


def test_async_llm_streams_a_draft_models_answers(tiny_llama):
    """Through AsyncLLM (the engine core in its own process), a draft model gives the plain engine's tokens."""
    import asyncio

    from minivllm import AsyncLLM

    folder, _ = tiny_llama
    prompts = [[5, 6, 7] * 3, [1, 2, 3, 4]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = LLM(folder, max_model_len=80, num_kv_blocks=40)
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    spec = {"method": "draft_model", "model": folder, "num_speculative_tokens": 3}
    engine = AsyncLLM(folder, max_model_len=80, num_kv_blocks=40, speculative_config=spec)
    try:
        async def main():
            async def last(i, prompt):
                return [out async for out in engine.generate(prompt, params, f"r{i}")][-1]
            return await asyncio.gather(*(last(i, p) for i, p in enumerate(prompts)))

        outs = asyncio.run(main())
        assert [o.outputs[0].token_ids for o in outs] == expected
        stats = engine.get_stats()
        assert stats["num_accepted_tokens"] == stats["num_draft_tokens"] > 0  # the target as its own draft
    finally:
        engine.shutdown()
