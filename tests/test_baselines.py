"""The naive generators agree with the engine and with each other."""
import torch

from minivllm import LLM, SamplingParams
from minivllm.models.loader import resolve_model
from minivllm_lab.baselines import (
    hf_generate_continuous,
    hf_generate_sequential,
    hf_generate_static_batch,
    hf_model_for,
    recompute_generate,
)


def test_all_baselines_agree_with_the_engine(tiny_llama):
    folder, _ = tiny_llama
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (3, 11, 6)]
    llm = LLM(folder, max_model_len=64, num_kv_blocks=16)
    engine = [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8,
                                                                                    ignore_eos=True))]
    assert recompute_generate(llm.llm_engine.model, prompts, 8) == engine
    hf = hf_model_for(resolve_model(folder), "cpu", torch.float32)
    assert hf_generate_sequential(hf, prompts, 8) == engine
    assert hf_generate_static_batch(hf, prompts, 8, batch_size=2) == engine
    assert hf_generate_continuous(hf, prompts, 8) == engine
    # Per-request lengths (W2): each request stops at its own max_tokens.
    assert hf_generate_continuous(hf, prompts, [8, 2, 5]) == [engine[0], engine[1][:2], engine[2][:5]]


def test_hf_model_for_a_shape_only_preset():
    source = resolve_model("mistral-7b")
    assert source.folder is None and source.config.num_kv_heads == 8 and source.config.head_dim == 128
