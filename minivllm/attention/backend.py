"""What an attention backend is: one object, chosen once when the model is built, that

- builds a step's metadata for its kernels (`build_metadata`: once per step, for every layer), and
- runs each layer's attention on it (`forward`: store the step's keys and values, then attend).

It also owns the model's sliding window, the one place the window lives: the torch reference draws it into
its masks, the Triton kernels skip the blocks outside it. Two backends: `torch_ref.TorchAttentionBackend`
(readable, any device) and `triton_backend.TritonAttentionBackend` (the fused kernels); `selector.py`
picks one by name.
"""
from __future__ import annotations

import torch

from .metadata import AttentionMetadata


class AttentionBackend:
    name: str
    supports_cuda_graphs = False  # whether its decode and verify steps can be captured (no host syncs, fixed shapes)

    def __init__(self, sliding_window: int | None = None):
        self.sliding_window = sliding_window

    def build_metadata(self, meta: AttentionMetadata) -> AttentionMetadata:
        """The step's metadata plus what this backend's kernels need."""
        raise NotImplementedError

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] of this step's tokens -> [T, Hq, D]; k/v stored into the cache."""
        raise NotImplementedError
