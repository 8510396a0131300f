"""Attention: the metadata of a flat batch, the torch reference, and the layer that uses them."""
from .layer import Attention
from .metadata import AttentionMetadata, NoCacheMetadata

__all__ = ["Attention", "AttentionMetadata", "NoCacheMetadata"]
