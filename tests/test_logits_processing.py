"""Penalties, logit bias, min_tokens and min_p change exactly what they should.

Greedy tokens of the engine with each option equal a reference written here: transformers' own forward,
one token at a time, with the option applied to its logits by the few lines below (vLLM's and OpenAI's
definitions), with the CPU and the GPU overlapped or not. Each case also differs from plain greedy, so
the option did something. min_p is checked on the sampler itself: what it may draw, over many draws.
"""
from collections import Counter

import pytest
import torch
from test_engine import random_prompts

from minivllm import LLM, SamplingParams
from minivllm.worker.sampler import sample

N = 16


@torch.no_grad()
def reference_greedy(hf, prompt, n, presence=0.0, frequency=0.0, repetition=1.0, bias=None, min_tokens=0,
                     stop_ids=()):
    tokens, answer = list(prompt), []
    for _ in range(n):
        logits = hf(torch.tensor([tokens])).logits[0, -1].float()
        for t in set(tokens):  # the prompt and the answer so far
            logits[t] = logits[t] / repetition if logits[t] > 0 else logits[t] * repetition
        for t, count in Counter(answer).items():
            logits[t] -= frequency * count + presence
        for t, b in (bias or {}).items():
            logits[t] += b
        if len(answer) < min_tokens:
            logits[list(stop_ids)] = float("-inf")
        answer.append(int(logits.argmax()))
        tokens.append(answer[-1])
        if answer[-1] in stop_ids and len(answer) >= min_tokens:
            break
    return answer


CASES = {
    "frequency": dict(frequency_penalty=1.5),
    "presence": dict(presence_penalty=2.0),
    "repetition": dict(repetition_penalty=1.8),
    "all three, negative": dict(presence_penalty=-0.5, frequency_penalty=0.7, repetition_penalty=1.3),
    "logit bias": dict(logit_bias={7: 3.0, 11: 2.0}),
}


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_penalties_and_bias_match_a_reference(tiny_llama, case, overlap):
    folder, hf = tiny_llama
    prompts = random_prompts(4, seed=5)
    kw = CASES[case]
    llm = LLM(folder, max_model_len=80, num_kv_blocks=40, async_scheduling=overlap)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, **kw), use_tqdm=False)
    plain = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True), use_tqdm=False)
    ref_kw = dict(presence=kw.get("presence_penalty", 0.0), frequency=kw.get("frequency_penalty", 0.0),
                  repetition=kw.get("repetition_penalty", 1.0), bias=kw.get("logit_bias"))
    got = [o.outputs[0].token_ids for o in outs]
    assert got == [reference_greedy(hf, p, N, **ref_kw) for p in prompts]
    assert got != [o.outputs[0].token_ids for o in plain]  # the option changed the answers
    stats = llm.llm_engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.parametrize("overlap", [True, False])
def test_min_tokens_holds_back_the_stop_tokens(tiny_llama, overlap):
    folder, hf = tiny_llama
    prompt = random_prompts(1, seed=9)[0]
    llm = LLM(folder, max_model_len=80, num_kv_blocks=40, async_scheduling=overlap)
    first = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=N, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0].token_ids
    stop = first[1]  # greedy would stop at the second token
    params = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, stop_token_ids=[stop], min_tokens=6)
    got = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    assert stop not in got[:6] and len(got) >= 6
    assert got == reference_greedy(hf, prompt, N, min_tokens=6, stop_ids=(stop,))


def test_min_p_draws_only_tokens_near_the_most_likely():
    probs = torch.tensor([0.40, 0.30, 0.15, 0.10, 0.05])
    logits = probs.log().expand(20000, 5).contiguous()
    ones = torch.ones(20000)
    g = torch.Generator().manual_seed(0)
    drawn = sample(logits, ones, torch.full((20000,), -1), ones, [], g, min_p=torch.full((20000,), 0.3))
    counts = torch.bincount(drawn, minlength=5)
    assert counts[3] == counts[4] == 0            # 0.10 and 0.05 are below 0.3 x 0.40
    assert (counts[:3] > 0).all()                 # 0.40, 0.30 and 0.15 all stay
    # Renormalised over what is left: 0.40 / 0.85 of the draws go to the first token.
    assert abs(counts[0].item() / 20000 - 0.40 / 0.85) < 0.02


def test_penalised_requests_through_the_engine_with_speculation_still_match(tiny_llama):
    """With an n-gram proposer, a penalised request gets no guesses and the same tokens; its batch-mates guess."""
    folder, hf = tiny_llama
    prompts = random_prompts(3, seed=5)
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    llm = LLM(folder, max_model_len=80, num_kv_blocks=40, speculative_config=spec)
    params = [SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, frequency_penalty=1.5),
              SamplingParams(temperature=0, max_tokens=N, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, logit_bias={7: 3.0})]
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got[0] == reference_greedy(hf, prompts[0], N, frequency=1.5)
    assert got[1] == reference_greedy(hf, prompts[1], N)
    assert got[2] == reference_greedy(hf, prompts[2], N, bias={7: 3.0})


def test_a_bias_outside_the_vocabulary_is_refused_alone(tiny_llama):
    llm = LLM(tiny_llama[0], max_model_len=80, num_kv_blocks=40)
    with pytest.raises(ValueError, match="logit_bias"):
        llm.llm_engine.add_request("x", [1, 2, 3], SamplingParams(logit_bias={211: 1.0}))
    assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)[0].finished


@pytest.mark.slow
def test_the_server_takes_the_fields_and_answers_as_the_offline_engine(tmp_path):
    """OpenAI's presence_penalty, frequency_penalty and logit_bias (keys as strings) and vLLM's repetition_penalty,
    min_tokens and min_p, through the real client and `minivllm serve` (its engine core in its own process):
    the offline engine's text; bad values are 400s naming the field."""
    import openai
    from server_utils import running_server
    from test_engine_core import TINY_WORDS

    from minivllm_lab.bench.word_model import write_word_model

    folder = str(write_word_model(tmp_path / "words", TINY_WORDS))
    prompt = "w5 w6 w7 w8 w9 w10"
    fields = dict(presence_penalty=0.5, frequency_penalty=1.0, logit_bias={"17": 4.0})
    extra = dict(repetition_penalty=1.2, min_tokens=3, ignore_eos=True)
    # On the CPU in float32 as the server (tests/server_utils.py): random weights give near-ties that another
    # device's arithmetic may break the other way.
    offline = LLM(folder, load_format="dummy", max_model_len=80, num_kv_blocks=40, device="cpu", dtype="float32")
    expected = offline.generate([prompt], SamplingParams(
        temperature=0, max_tokens=12, presence_penalty=0.5, frequency_penalty=1.0, logit_bias={17: 4.0},
        repetition_penalty=1.2, min_tokens=3, ignore_eos=True), use_tqdm=False)[0].outputs[0].text
    with running_server(folder, "--max-model-len", "80", "--num-kv-blocks", "40", "--load-format", "dummy",
                        served_model_name="tiny") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        got = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, **fields,
                                        extra_body=extra)
        assert got.choices[0].text == expected
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                              max_completion_tokens=5, temperature=0.7, seed=1, **fields,
                                              extra_body={**extra, "min_p": 0.2})
        assert chat.usage.completion_tokens == 5
        for bad in (dict(presence_penalty=3), dict(logit_bias={"x": 1}), dict(extra_body={"min_tokens": -1})):
            with pytest.raises(openai.BadRequestError) as e:
                client.completions.create(model="tiny", prompt=prompt, max_tokens=4, **bad)
            name = next(iter(bad.get("extra_body", bad)))
            assert name in str(e.value)
