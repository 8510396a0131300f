"""Chooses an attention backend by name (vLLM's `get_attn_backend`)."""
from __future__ import annotations

from .backend import AttentionBackend
from .torch_ref import TorchAttentionBackend

BACKENDS = ("torch", "triton")


def get_attention_backend(name: str, sliding_window: int | None = None) -> AttentionBackend:
    if name == "triton":
        from .triton_backend import TritonAttentionBackend  # imports triton only when asked for
        return TritonAttentionBackend(sliding_window)
    if name == "torch":
        return TorchAttentionBackend(sliding_window)
    raise ValueError(f"attention backend must be one of {BACKENDS}, got {name!r}")
