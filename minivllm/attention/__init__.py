"""Attention: a flat batch's metadata, the backends (torch reference, Triton kernels) and the layer."""
from __future__ import annotations

from .backend import AttentionBackend
from .layer import Attention
from .metadata import AttentionMetadata, NoCacheMetadata
from .selector import get_attention_backend

__all__ = ["Attention", "AttentionBackend", "AttentionMetadata", "NoCacheMetadata", "get_attention_backend"]
