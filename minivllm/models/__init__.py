"""Models: the Llama/Mistral transformer, its building blocks, loading and presets."""
from .llama import LlamaForCausalLM
from .loader import build_model, resolve_model

__all__ = ["LlamaForCausalLM", "build_model", "resolve_model"]
