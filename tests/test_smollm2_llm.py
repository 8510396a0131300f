"""The offline real model through the public API: real text, chat, and equality with transformers."""
import pytest
import torch

from minivllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM("smollm2-135m", max_model_len=256, num_kv_blocks=64)


def test_real_text(llm):
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8))[0]
    assert "Paris" in out.outputs[0].text


def test_matches_transformers_greedy(llm):
    from transformers import AutoModelForCausalLM

    from minivllm.models.loader import resolve_model
    hf = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m").folder, dtype=torch.float32)
    prompts = ["Once upon a time", "def fibonacci(n):"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for text, out in zip(prompts, outs):
        ids = torch.tensor([llm.tokenizer.encode(text)])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, min_new_tokens=20,
                          do_sample=False)[0, ids.shape[1]:].tolist()
        assert out.outputs[0].token_ids == ref


def test_chat_stops_at_the_end_of_the_turn(llm):
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=40))[0].outputs[0]
    assert "Paris" in out.text and out.finish_reason == "stop"
