"""Random request bodies against the real server: whatever a client sends, no answer is a 5xx and the
server lives on (a tiny random model with a word tokenizer, so that the bodies that are valid run fast)."""
from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from minivllm.server.launcher import running_server
from minivllm_lab.bench.word_model import write_word_model

pytestmark = pytest.mark.slow
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128, "hidden_size": 32,
          "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
          "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "torch_dtype": "float32"}

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.sampled_from([0, 1, -1, 2**31, 2**63, 1e308, 0.5]) | st.text(max_size=8)
           | st.sampled_from(["w1 w2", "", "text", "assistant", "user", "auto"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": json_values}),
                 max_size=2)
roles = st.sampled_from(["user", "system", "assistant", "tool", 5])
messages = st.just([{"role": "user", "content": "w1 w2"}]) | st.lists(st.fixed_dictionaries({"role": roles,
                                           "content": st.sampled_from(["w1 w2", ""]) | parts | json_values}),
                    max_size=3) | json_values
FIELDS = ["model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
          "stop_token_ids", "n", "stream", "stream_options", "ignore_eos", "logprobs", "top_logprobs", "tools",
          "tool_choice", "response_format", "echo", "logit_bias", "presence_penalty", "best_of", "suffix", "user",
          "no_such_field"]
# Most bodies are nearly valid (the right model, a small max_tokens), so the checks past the first are reached.
fields = st.just({}) | st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=3)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = str(write_word_model(tmp_path_factory.mktemp("fuzz-words"), CONFIG))
    flags = [folder, "--load-format", "dummy", "--device", "cpu", "--dtype", "float32", "--max-model-len", "64",
             "--num-kv-blocks", "32", "--log-level", "warning"]
    with running_server(flags, startup_timeout_s=300) as url:
        yield url, folder


def post(url: str, path: str, body) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat=st.booleans(), prompt=st.sampled_from(["w1 w2 w3", [1, 2, 3], ["w4"], [[5, 6]]]) | json_values,
       conversation=messages, extra=fields, use_model=st.booleans(), small=st.booleans())
def test_random_bodies_never_get_a_5xx(server, chat, prompt, conversation, extra, use_model, small):
    url, folder = server
    body = {"messages": conversation} if chat else {"prompt": prompt}
    if use_model:
        body["model"] = folder
    if small:
        body["max_tokens"] = 4
    body.update(extra)
    response = post(url, "/v1/chat/completions" if chat else "/v1/completions", body)
    event(f"status {response.status_code}")
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"] and error["type"]


def test_bodies_that_are_not_objects_and_the_server_lives_on(server):
    url, folder = server
    for path in ("/v1/completions", "/v1/chat/completions"):
        for body in (None, [], "text", 5, [{"model": folder}]):
            assert post(url, path, body).status_code == 400
        for raw in (b"{not json", b'{"model": "m", "prompt": "w1", "temperature": NaN}',
                    b'{"model": "m", "prompt": "w1", "max_tokens": Infinity}', b"\xff\xfe"):
            answer = httpx.post(url + path, content=raw, headers={"content-type": "application/json"})
            assert answer.status_code == 400, (raw, answer.text)
    assert httpx.get(url + "/health").status_code == 200
    ok = post(url, "/v1/completions", {"model": folder, "prompt": [1, 2], "max_tokens": 3, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
