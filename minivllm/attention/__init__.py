"""Attention: the metadata of a flat batch, the torch reference, the Triton backend, and the layer."""
from __future__ import annotations

from typing import Callable

from .layer import Attention
from .metadata import AttentionMetadata, NoCacheMetadata


def metadata_builder(backend: str, sliding_window: int | None) -> Callable[[AttentionMetadata], AttentionMetadata]:
    """The one place a step's metadata gets what `backend`'s kernels need, once per step for all layers."""
    if backend == "triton":
        from .triton_backend import TritonAttentionMetadata  # triton loads only when asked for
        return TritonAttentionMetadata.build
    from .torch_ref import TorchAttentionMetadata
    return lambda meta: TorchAttentionMetadata.build(meta, sliding_window)


__all__ = ["Attention", "AttentionMetadata", "NoCacheMetadata", "metadata_builder"]
