"""The model against transformers: every block, and whole-model logits (float32, CPU)."""
import json

import pytest
import torch

from conftest import make_checkpoint
from minivllm.attention import NoCacheMetadata
from minivllm.config import ModelConfig
from minivllm.layers.basic import RMSNorm, RotaryEmbedding, silu_and_mul
from minivllm.models.loader import build_model, resolve_model


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def minivllm_logits(folder, token_lists):
    """Full logits of each prompt from minivllm, all prompts in one flat batch, no cache."""
    source = resolve_model(folder)
    model = build_model(source.config, "cpu", torch.float32, 256, source.folder)
    lens = [len(t) for t in token_lists]
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    ids = torch.tensor([t for ts in token_lists for t in ts])
    positions = torch.cat([torch.arange(n) for n in lens])
    with torch.no_grad():
        logits = model.compute_logits(model(ids, positions, NoCacheMetadata(cu, max(lens))))
    return logits.split(lens)


@pytest.mark.parametrize("arch,heads,kv_heads,overrides", [
    ("llama", 4, 4, {}),                                    # multi-head attention
    ("llama", 4, 2, {}),                                    # GQA 2:1
    ("llama", 6, 2, {"tie_word_embeddings": True, "hidden_size": 96}),  # GQA 3:1, tied, like SmolLM2
    ("llama", 4, 1, {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}}),
    ("llama", 4, 2, {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 10000.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 16}}),
    ("mistral", 4, 2, {"sliding_window": 5}),               # window shorter than the input
    ("mistral", 8, 2, {"sliding_window": None}),
])
def test_logits_match_transformers(tmp_path, arch, heads, kv_heads, overrides):
    folder, hf = make_checkpoint(tmp_path, arch, heads, kv_heads, seed=heads * 7 + kv_heads, **overrides)
    g = torch.Generator().manual_seed(hash((arch, heads, kv_heads)) % 1000)
    prompts = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (1, 9, 23)]
    ours = minivllm_logits(folder, prompts)
    for p, logits in zip(prompts, ours):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0]
        assert rel_err(logits, ref) < 1e-4


def test_rmsnorm_and_fused_residual_match_transformers():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    x, res = torch.randn(5, 32), torch.randn(5, 32)
    ours, ref = RMSNorm(32, 1e-5), LlamaRMSNorm(32, 1e-5)
    ours.weight.data.normal_()
    ref.weight.data.copy_(ours.weight)
    torch.testing.assert_close(ours(x), ref(x))
    normed, new_res = ours(x, res)
    torch.testing.assert_close(new_res, x + res)
    torch.testing.assert_close(normed, ref(x + res))


def test_rotary_matches_transformers():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=64)
    positions = torch.tensor([0, 3, 17, 63])
    q, k = torch.randn(4, 4, 16), torch.randn(4, 2, 16)
    cos, sin = LlamaRotaryEmbedding(cfg)(q, positions[None])
    ref_q, ref_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    ours_q, ours_k = RotaryEmbedding(16, 64, 10000.0)(positions, q, k)
    torch.testing.assert_close(ours_q, ref_q[0].transpose(0, 1))
    torch.testing.assert_close(ours_k, ref_k[0].transpose(0, 1))


def test_silu_and_mul():
    x = torch.randn(3, 10)
    torch.testing.assert_close(silu_and_mul(x), torch.nn.functional.silu(x[:, :5]) * x[:, 5:])


def test_sharded_checkpoint_loads(tmp_path):
    folder, hf = make_checkpoint(tmp_path, "llama", 4, 2)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="50KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    prompt = [[5, 9, 100, 3]]
    torch.testing.assert_close(minivllm_logits(tmp_path / "sharded", prompt)[0], minivllm_logits(folder, prompt)[0])


def test_config_reads_both_rope_formats():
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2}
    old = ModelConfig.from_dict({**base, "rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 4.0}})
    new = ModelConfig.from_dict({**base, "rope_parameters": {"rope_theta": 5e5, "rope_type": "linear", "factor": 4.0}})
    assert old.rope_theta == new.rope_theta == 5e5
    assert old.rope_scaling["rope_type"] == new.rope_scaling["rope_type"] == "linear"
    assert old.num_kv_heads == 2 and old.head_dim == 4


def test_bad_models_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        resolve_model(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="malformed"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported architecture"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 5}))
    with pytest.raises(ValueError, match="missing required field"):
        resolve_model(str(tmp_path))


def test_missing_weights_is_a_clear_error(tmp_path):
    folder, _ = make_checkpoint(tmp_path, "llama", 4, 2)
    (tmp_path / "model.safetensors").unlink()
    source = resolve_model(folder)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        build_model(source.config, "cpu", torch.float32, 64, source.folder)


def test_dummy_weights_have_the_checkpoint_shape(tiny_llama):
    from minivllm import LLM
    llm = LLM(tiny_llama[0], load_format="dummy", max_model_len=64, num_kv_blocks=16)
    ours = dict(llm.llm_engine.model.named_parameters())
    n_ours = sum(p.numel() for p in ours.values())
    assert n_ours == sum(p.numel() for p in tiny_llama[1].parameters())
    assert not torch.equal(ours["model.embed_tokens.weight"], tiny_llama[1].model.embed_tokens.weight)


def test_hub_id_downloads_with_huggingface_hub(tiny_llama, monkeypatch):
    import huggingface_hub
    calls = []

    def fake_download(repo_id, allow_patterns):
        calls.append(repo_id)
        return tiny_llama[0]

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    source = resolve_model("someone/tiny-llama")
    assert calls == ["someone/tiny-llama"] and str(source.folder) == tiny_llama[0]

    def offline(repo_id, allow_patterns):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(FileNotFoundError, match="could not download 'someone/tiny-llama'"):
        resolve_model("someone/tiny-llama")


def test_a_checkpoint_missing_one_part_of_a_packed_weight_is_refused(tiny_llama, tmp_path):
    """q_proj alone does not make qkv_proj: the missing k_proj is named, not left random."""
    import shutil

    from safetensors.torch import load_file, save_file

    from minivllm.models.loader import build_model, resolve_model
    folder = tmp_path / "no_k"
    shutil.copytree(tiny_llama[0], folder)
    weights = load_file(str(folder / "model.safetensors"))
    del weights["model.layers.0.self_attn.k_proj.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    source = resolve_model(str(folder))
    with pytest.raises(ValueError, match=r"lacks \['model.layers.0.self_attn.qkv_proj.weight \(part 1\)'\]"):
        build_model(source.config, "cpu", torch.float32, 64, source.folder)
