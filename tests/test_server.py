"""The real server in a subprocess (SmolLM2-135M on the CPU), driven by the official `openai` client."""
import asyncio
import re
import threading
import time

import httpx
import openai
import pytest
from server_utils import running_server

from minivllm import LLM, SamplingParams

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m"
ENGINE_FLAGS = ("--max-model-len", "512", "--num-kv-blocks", "96", "--max-num-seqs", "16")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def base_url():
    with running_server(MODEL, *ENGINE_FLAGS) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL, max_model_len=512, num_kv_blocks=96, device="cpu", dtype="float32")


def metrics(base_url) -> dict:
    text = httpx.get(base_url + "/metrics").text
    return {m[1]: float(m[2]) for m in re.finditer(r"^minivllm:(\w+)\{[^}]*\} (\S+)$", text, re.M)}


def wait_idle(base_url) -> dict:
    for _ in range(300):
        m = metrics(base_url)
        if m["num_requests_running"] == m["num_requests_waiting"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"server never went idle: {m}")


def test_models_and_health(client, base_url):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(base_url + "/health").status_code == 200


def test_greedy_chat_equals_llm_chat(client, llm):
    reference = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0]
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=24)
    assert answer.choices[0].message.content == reference.outputs[0].text
    assert "Paris" in answer.choices[0].message.content
    assert answer.choices[0].finish_reason == reference.outputs[0].finish_reason
    assert answer.usage.prompt_tokens == len(reference.prompt_token_ids)
    assert answer.usage.completion_tokens == len(reference.outputs[0].token_ids)
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_streamed_deltas_join_to_the_same_text(client):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=24)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=24,
                                                 stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([d for d in deltas if d]) > 3  # it streamed, token by token
    assert "".join(deltas) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


def test_completions_text_and_token_ids(client, llm):
    ids = llm.tokenizer.encode("The capital of France is")
    ref = llm.generate(ids, SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)[0].outputs[0]
    by_text = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=10)
    by_ids = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=10)
    assert by_text.choices[0].text == by_ids.choices[0].text == ref.text
    assert by_ids.usage.prompt_tokens == len(ids) and by_ids.usage.completion_tokens == len(ref.token_ids)
    stream = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=10, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == ref.text


def test_sampling_fields_are_honoured(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0.9, top_p=0.9, seed=7,
              extra_body={"top_k": 20})
    first, again = client.completions.create(**kw), client.completions.create(**kw)
    assert first.choices[0].text == again.choices[0].text  # the same seed, the same tokens
    free = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=12)
    text = free.choices[0].text
    stopped = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0,
                                        max_tokens=12, stop=["."])
    assert "." in text and stopped.choices[0].text == text[:text.index(".")]
    assert stopped.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body, status", [
    ({"model": MODEL, "messages": QUESTION, "temperature": -1}, 400),
    ({"model": MODEL, "messages": QUESTION, "top_p": 0}, 400),
    ({"model": MODEL, "messages": QUESTION, "max_tokens": 0}, 400),
    ({"model": MODEL, "messages": QUESTION, "max_tokens": "many"}, 400),
    ({"model": MODEL, "messages": QUESTION, "n": 0}, 400),
    ({"model": MODEL, "messages": [{"content": "no role"}]}, 400),
    ({"model": MODEL, "messages": []}, 400),
    ({"model": MODEL}, 400),
    ({"messages": QUESTION}, 400),
    ({"model": MODEL, "messages": [{"role": "user", "content": "word " * 600}]}, 400),  # over max_model_len
    ({"model": "gpt-4", "messages": QUESTION}, 404),
])
def test_bad_requests_get_openai_errors(base_url, body, status):
    r = httpx.post(base_url + "/v1/chat/completions", json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["message"] and error["type"] and error["code"] == status


def test_bad_completions_and_invalid_json(base_url, client):
    for body in ['{"model": ', "[1, 2]", '{"model": "smollm2-135m", "prompt": [1, "a"]}',
                 '{"model": "smollm2-135m", "prompt": [999999999]}', '{"model": "smollm2-135m", "prompt": ""}']:
        r = httpx.post(base_url + "/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == 400, body
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=-3)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=QUESTION)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens >= 1


def test_many_streams_half_hang_up_nothing_leaks(base_url):
    """24 concurrent streams (more than --max-num-seqs: some queue); half the clients leave early."""
    aclient = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    generated_before = metrics(base_url)["generation_tokens_total"]

    async def one(i):
        stream = await aclient.completions.create(model=MODEL, prompt=f"Story number {i}:", max_tokens=40,
                                                  temperature=0.8, seed=i, stream=True,
                                                  stream_options={"include_usage": True},
                                                  extra_body={"ignore_eos": True})
        n, tokens = 0, 0
        async for chunk in stream:
            n += 1
            if i % 2 and n == 3:   # hang up mid-stream
                await stream.close()
                return None
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        # Tokens, not chunks: a client that reads slower than the engine steps gets the steps it missed
        # merged into one chunk, so 40 tokens may come in fewer than 40 chunks.
        return tokens

    async def main():
        return await asyncio.gather(*[one(i) for i in range(24)])

    counts = asyncio.run(main())
    assert all(c is None for c in counts[1::2]) and all(c >= 40 for c in counts[::2])
    m = wait_idle(base_url)
    assert m["kv_cache_usage_perc"] == 0
    # The 12 that left generated far less than their 40 tokens each: their requests were aborted.
    assert m["generation_tokens_total"] - generated_before < 12 * 40 + 12 * 40 / 2


def test_whole_answer_client_gone_aborts(base_url):
    before = metrics(base_url)["generation_tokens_total"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base_url + "/v1/completions", timeout=1.0,
                   json={"model": MODEL, "prompt": "Count:", "max_tokens": 400, "ignore_eos": True})
    m = wait_idle(base_url)
    assert m["kv_cache_usage_perc"] == 0 and m["generation_tokens_total"] - before < 400


def test_health_answers_while_the_engine_is_busy(base_url):
    def load():
        httpx.post(base_url + "/v1/completions", timeout=120,
                   json={"model": MODEL, "prompt": ["word " * 300], "max_tokens": 64, "ignore_eos": True})
    workers = [threading.Thread(target=load) for _ in range(8)]
    for w in workers:
        w.start()
    time.sleep(0.5)
    busy = metrics(base_url)["num_requests_running"]
    latencies = []
    for _ in range(5):
        t = time.perf_counter()
        assert httpx.get(base_url + "/health", timeout=5).status_code == 200
        latencies.append(time.perf_counter() - t)
    for w in workers:
        w.join()
    assert busy > 0
    assert max(latencies) < 1.0, latencies  # the bound: a step never blocks the event loop
    m = wait_idle(base_url)
    assert m["kv_cache_usage_perc"] == 0


def test_metrics_names(base_url):
    text = httpx.get(base_url + "/metrics").text
    for name in ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
                 "generation_tokens_total", "num_preemptions_total", "time_to_first_token_seconds_bucket",
                 "time_per_output_token_seconds_count", "e2e_request_latency_seconds_sum"]:
        assert f"minivllm:{name}" in text, name
    assert metrics(base_url)["time_to_first_token_seconds_count"] > 0
