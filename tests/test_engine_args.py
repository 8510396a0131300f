"""Every engine keyword and sampling value is checked at the door, with a message that says what to do."""
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_model_len=0), "max_model_len must be a positive integer"),
    (dict(max_model_len=10**6), "exceeds the model's 256 positions"),
    (dict(num_kv_blocks=0), "num_kv_blocks must be a positive integer"),
    (dict(max_num_batched_tokens=-1), "max_num_batched_tokens must be a positive integer"),
    (dict(block_size=2.5), "block_size must be a positive integer"),
    (dict(dtype="float8"), "dtype must be one of"),
    (dict(device="tpu"), "device must be"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(load_format="pt"), "load_format"),
])
def test_bad_engine_keywords(tiny_llama, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(tiny_llama[0], **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_a_gpu(tiny_llama):
    with pytest.raises(ValueError, match="no CUDA GPU is visible"):
        LLM(tiny_llama[0], device="cuda")


def test_unknown_keyword_names_llm(tiny_llama):
    with pytest.raises(TypeError, match=r"LLM\(\) got unknown keyword argument \['max_len'\]"):
        LLM(tiny_llama[0], max_len=10)


@pytest.mark.parametrize("kwargs", [dict(max_tokens=None), dict(max_tokens="8"), dict(temperature="hot"),
                                    dict(top_p=float("nan")), dict(top_k=1.5), dict(seed="x"), dict(stop=[""]),
                                    dict(stop=[1]), dict(stop_token_ids=["a"]), dict(max_tokens=True)])
def test_bad_sampling_values(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_chat_message_without_a_role():
    llm = LLM("smollm2-135m", max_model_len=128, num_kv_blocks=16)
    with pytest.raises(ValueError, match=r"messages\[1\].role"):
        llm.chat([{"role": "user", "content": "hi"}, {"content": "no role"}])


def test_the_memory_limit_sizes_the_kv_budget_as_on_a_gpu_of_that_size(monkeypatch):
    """gpu_memory_limit_bytes (the T4 profile's 15 GiB on a bigger GPU): gpu_memory_utilization is a share of
    the limit, and what other processes hold does not count; without it, of the whole GPU minus theirs."""
    from minivllm.worker import kv_cache
    GiB = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * GiB, 140 * GiB))  # 40 GiB in use
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 10 * GiB)             # 10 of them ours
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 5 * GiB)         # weights + peak
    whole = kv_cache.kv_cache_budget_bytes("cuda", 0.9)
    assert whole == int(140 * GiB * 0.9 - 30 * GiB - 5 * GiB)
    limited = kv_cache.kv_cache_budget_bytes("cuda", 0.9, gpu_memory_limit_bytes=15 * GiB)
    assert limited == int(15 * GiB * 0.9 - 5 * GiB)
    with pytest.raises(ValueError, match="gpu_memory_limit_bytes"):
        EngineConfig("m", device="cpu", gpu_memory_limit_bytes=0)
