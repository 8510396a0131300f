"""The server's logprobs and n, with the real `openai` client and real SmolLM2 (float32, CPU).

Greedy logprobs equal log_softmax of transformers' logits on the same folder, chat and completions, whole
and streamed; n answers equal those their seeds give alone, streamed with their index, usage counting them
all; a stream left mid-way frees every block; bad values are 400s.
"""
import re
import time

import httpx
import openai
import pytest
import torch
from server_utils import running_server

from minivllm.chat import encode_chat
from minivllm.models.loader import load_tokenizer, resolve_model
from minivllm_lab.baselines import hf_model_for

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
N = 8


@pytest.fixture(scope="module")
def base_url():
    with running_server(MODEL, "--max-model-len", "256", "--num-kv-blocks", "64", "--max-num-seqs", "8") as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference():
    """greedy(prompt ids) -> [(decoded token, its logprob, [(decoded, logprob) of the top 20])] per step."""
    source = resolve_model(MODEL)
    hf, tokenizer = hf_model_for(source, "cpu", torch.float32), load_tokenizer(source.folder)

    @torch.no_grad()
    def greedy(prompt_ids):
        tokens, steps = list(prompt_ids), []
        for _ in range(N):
            row = hf(torch.tensor([tokens])).logits[0, -1].float().log_softmax(-1)
            top = row.topk(20)
            token = int(top.indices[0])
            steps.append((tokenizer.decode([token]), row[token].item(),
                          [(tokenizer.decode([t]), v) for t, v in zip(top.indices.tolist(), top.values.tolist())]))
            tokens.append(token)
        return steps

    return greedy, tokenizer


def test_chat_logprobs_equal_transformers(client, reference):
    greedy, tokenizer = reference
    ref = greedy(encode_chat(tokenizer, QUESTION))
    kw = dict(model=MODEL, messages=QUESTION, temperature=0, max_tokens=N, logprobs=True, top_logprobs=3)
    content = client.chat.completions.create(**kw).choices[0].logprobs.content
    assert len(content) == N
    for got, (token, logprob, top) in zip(content, ref):
        assert got.token == token and got.logprob == pytest.approx(logprob, abs=1e-3)
        assert got.bytes == list(token.encode())
        assert [t.token for t in got.top_logprobs] == [t for t, _ in top[:3]]
        assert [t.logprob for t in got.top_logprobs] == pytest.approx([v for _, v in top[:3]], abs=1e-3)
    streamed = [entry for chunk in client.chat.completions.create(**kw, stream=True)
                if chunk.choices and chunk.choices[0].logprobs for entry in chunk.choices[0].logprobs.content]
    # (the same numbers up to float32 rounding: the second request reuses the prompt's cached blocks)
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-4)


def test_completions_logprobs_equal_transformers(client, reference):
    greedy, tokenizer = reference
    prompt = "The capital of France is"
    ref = greedy(tokenizer.encode(prompt))
    kw = dict(model=MODEL, prompt=prompt, temperature=0, max_tokens=N, logprobs=2)
    answer = client.completions.create(**kw).choices[0]
    lp = answer.logprobs
    assert lp.tokens == [t for t, _, _ in ref] and "".join(lp.tokens) == answer.text
    assert lp.token_logprobs == pytest.approx([v for _, v, _ in ref], abs=1e-3)
    for got, (token, _, top) in zip(lp.top_logprobs, ref):  # the chosen token and the top 2 (here the same)
        assert got == pytest.approx(dict(top[:2]), abs=1e-3)
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(N)]
    chunks = [c.choices[0].logprobs for c in client.completions.create(**kw, stream=True)
              if c.choices and c.choices[0].logprobs]
    assert sum((c.tokens for c in chunks), []) == lp.tokens
    assert sum((c.token_logprobs for c in chunks), []) == pytest.approx(lp.token_logprobs, abs=1e-4)
    assert sum((c.text_offset for c in chunks), []) == lp.text_offset


def test_chat_n_answers_equal_their_seeds_alone(client):
    kw = dict(model=MODEL, messages=QUESTION, temperature=1.0, max_tokens=N)
    answer = client.chat.completions.create(**kw, n=4, seed=3)
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    alone = [client.chat.completions.create(**kw, seed=3 + i).choices[0].message.content for i in range(4)]
    assert [c.message.content for c in answer.choices] == alone
    assert len(set(alone)) > 1
    assert answer.usage.completion_tokens == 4 * N  # (no answer stopped early at this length)


def test_completions_n_streams_each_answer_with_its_index(client):
    kw = dict(model=MODEL, prompt="Once upon a time", temperature=1.0, max_tokens=N, n=3, seed=9, logprobs=1)
    whole = client.completions.create(**kw)
    texts, tokens, reasons, usage = {}, {}, {}, None
    for chunk in client.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            tokens[c.index] = tokens.get(c.index, []) + (c.logprobs.tokens if c.logprobs else [])
            reasons[c.index] = c.finish_reason or reasons.get(c.index)
        usage = chunk.usage or usage
    assert texts == {c.index: c.text for c in whole.choices}
    assert tokens == {c.index: c.logprobs.tokens for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices} == dict.fromkeys(range(3), "length")
    assert usage.completion_tokens == whole.usage.completion_tokens == 3 * N


def test_n_stream_left_mid_way_frees_every_block(base_url, client):
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=1.0, max_tokens=200, n=4,
                                            stream=True, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 8:  # the 4 role chunks, then some tokens
            stream.close()
            break
    for _ in range(300):
        text = httpx.get(base_url + "/metrics").text
        m = {k: float(v) for k, v in re.findall(r"^minivllm:(\w+)\{[^}]*\} (\S+)$", text, re.M)}
        if m["num_requests_running"] == m["num_requests_waiting"] == 0:
            break
        time.sleep(0.05)
    assert m["num_requests_running"] == 0 and m["kv_cache_usage_perc"] == 0
    assert m["generation_tokens_total"] < 4 * 200  # aborted: far from 4 answers of 200 tokens


@pytest.mark.parametrize("chat, fields", [
    (True, {"n": 0}), (True, {"n": 9}), (False, {"n": -1}), (False, {"n": True}),
    (True, {"logprobs": True, "top_logprobs": 21}), (True, {"logprobs": True, "top_logprobs": -1}),
    (True, {"top_logprobs": 2}), (False, {"logprobs": 21}), (False, {"logprobs": -1}),
])
def test_bad_logprobs_and_n_are_400s(client, chat, fields):
    with pytest.raises(openai.BadRequestError, match="logprobs|n"):
        if chat:
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, **fields)
        else:
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, **fields)
