"""The server's logprobs and n, with the real `openai` client and real SmolLM2 (float32, CPU).

Greedy logprobs equal log_softmax of transformers' logits on the same folder, chat and completions, whole
and streamed; bad values are 400s.
"""
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
def client():
    with running_server(MODEL, "--max-model-len", "256", "--num-kv-blocks", "64", "--max-num-seqs", "8") as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


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


@pytest.mark.parametrize("chat, fields", [
    (True, {"logprobs": True, "top_logprobs": 21}), (True, {"logprobs": True, "top_logprobs": -1}),
    (True, {"top_logprobs": 2}), (False, {"logprobs": 21}), (False, {"logprobs": -1}),
])
def test_bad_logprobs_are_400s(client, chat, fields):
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        if chat:
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, **fields)
        else:
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, **fields)
