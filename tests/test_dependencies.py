"""`import minivllm` and an LLM on a checkpoint folder need only the package's own dependencies: the
extras (plots, Jupyter, the server, the GGUF preset) stay out until their feature is used."""
import importlib.util
import subprocess
import sys

import pytest

from minivllm.config import EngineConfig

EXTRAS = ["matplotlib", "IPython", "ipywidgets", "fastapi", "uvicorn", "prometheus_client", "gguf", "accelerate",
          "triton", "httpx", "xgrammar"]


def test_the_engine_imports_no_extra(tiny_llama):
    code = (f"import sys; from minivllm import LLM, SamplingParams; "
            f"LLM({tiny_llama[0]!r}, num_kv_blocks=8)"
            f".generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False); "
            f"print(sorted(m for m in {EXTRAS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_without_triton_the_torch_path_is_chosen_and_triton_asked_for_by_name(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real_find_spec(name, *a))
    assert EngineConfig("m", device="cpu").attention_backend == "torch"
    with pytest.raises(ValueError, match=r"minivllm\[triton\]"):
        EngineConfig("m", device="cpu", attention_backend="triton")
