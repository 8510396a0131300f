"""max_num_seqs and max_num_batched_tokens sized by the device when not given, as vLLM V1 sizes them: large on a
GPU of 70 GiB or more that is not an A100, small elsewhere (a T4, the T4 profile's memory limit, a CPU); the
server's token budget smaller than offline use's; a value given always wins."""
from types import SimpleNamespace

import pytest
import torch

from minivllm import LLM, AsyncLLM
from minivllm.config import default_batch_limits

GiB = 2**30


@pytest.mark.parametrize("name, memory, limit, llm, server", [
    ("NVIDIA H200", 140 * GiB, None, (1024, 16384), (1024, 8192)),
    ("NVIDIA H100 80GB HBM3", 80 * GiB, None, (1024, 16384), (1024, 8192)),
    ("NVIDIA A100-SXM4-80GB", 80 * GiB, None, (256, 8192), (256, 2048)),   # vLLM: the larger budget slowed it
    ("NVIDIA L4", 22 * GiB, None, (256, 8192), (256, 2048)),
    ("Tesla T4", 15 * GiB, None, (256, 8192), (256, 2048)),
    ("NVIDIA H200", 140 * GiB, 15 * GiB, (256, 8192), (256, 2048)),         # the T4 profile on an H200
])
def test_gpu_defaults(monkeypatch, name, memory, limit, llm, server):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(name=name,
                                                                                            total_memory=memory))
    assert default_batch_limits("cuda", "llm", limit) == llm
    assert default_batch_limits("cuda:0", "server", limit) == server


def test_cpu_defaults_and_overrides(tiny_llama):
    assert default_batch_limits("cpu", "llm") == (256, 8192)
    assert default_batch_limits("cpu", "server") == (256, 2048)
    args = dict(max_model_len=64, num_kv_blocks=40)
    scheduler = LLM(tiny_llama[0], **args).llm_engine.scheduler
    assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens) == (256, 8192)
    core = AsyncLLM(tiny_llama[0], engine_core_process=False, **args)
    try:
        assert (core.max_num_seqs, core.input_processor.max_num_batched_tokens) == (256, 2048)
    finally:
        core.shutdown()
    scheduler = LLM(tiny_llama[0], max_num_seqs=7, max_num_batched_tokens=33, **args).llm_engine.scheduler
    assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens) == (7, 33)
