"""Attention: the metadata of a flat batch, the backends (the torch reference, the Triton kernels), and the layer.

Read in this order: `metadata.py` (what travels with a batch), `backend.py` (what a backend does),
`torch_ref.py` and `triton_backend.py` (the two backends), `selector.py` (one chosen by name), `layer.py`.
"""
from __future__ import annotations

from .backend import AttentionBackend
from .layer import Attention
from .metadata import AttentionMetadata, NoCacheMetadata
from .selector import get_attention_backend

__all__ = ["Attention", "AttentionBackend", "AttentionMetadata", "NoCacheMetadata", "get_attention_backend"]
