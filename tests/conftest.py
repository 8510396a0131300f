"""Shared fixtures: tiny Llama/Mistral checkpoints made with transformers at test time."""
from __future__ import annotations

import pytest
import torch

TINY = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            max_position_embeddings=256, rms_norm_eps=1e-6)


def make_checkpoint(folder, arch="llama", num_heads=4, num_kv_heads=2, seed=0, **overrides):
    """Save a random transformers model of the given family to `folder`; return (folder, hf_model)."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
    torch.manual_seed(seed)
    kwargs = {**TINY, "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads, **overrides}
    if arch == "llama":
        config, cls = LlamaConfig(**kwargs), LlamaForCausalLM
    else:
        config, cls = MistralConfig(**kwargs), MistralForCausalLM
    model = cls(config).eval()
    model.save_pretrained(folder)
    return str(folder), model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_mistral(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny_mistral"), arch="mistral", num_heads=4,
                           num_kv_heads=1, sliding_window=7)


@pytest.fixture
def stand_in_graphs(monkeypatch):
    """CUDA graphs on the CPU: the runner's graphs keep the forward they would record, and a replay runs it, so
    everything of the graph path but the capture itself is tested (buffers, padding, which graph a step takes)."""
    from types import SimpleNamespace

    from minivllm.worker import model_runner
    from minivllm.worker.cuda_graphs import CUDAGraphs

    class StandInGraphs(CUDAGraphs):
        def _capture(self, forward):
            return SimpleNamespace(replay=forward)

    monkeypatch.setattr(model_runner, "CUDAGraphs", StandInGraphs)
