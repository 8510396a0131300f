"""CustomOp: one layer, two implementations, the choice made once when the model is built.

vLLM's pattern. A layer that has a fused Triton kernel writes `forward_native` (the readable torch
reference) and `forward_triton` (the kernel, same interface, same numbers: the tests hold them equal).
`set_backend` binds one of the two as the layer's forward, so a forward call does no test of a
backend name: the model is built for one backend (`LLM(attention_backend=...)`) and stays that way.

    >>> norm = RMSNorm(4096)          # a CustomOp
    >>> norm.set_backend("triton")    # every later call runs forward_triton
"""
from __future__ import annotations

from torch import nn

BACKENDS = ("torch", "triton")


class CustomOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.set_backend("torch")

    def set_backend(self, backend: str) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        # The class's function, not a bound method: a bound method kept on the module would be a reference
        # cycle, and the model's memory would wait for the garbage collector instead of being freed at once.
        self._forward = type(self).forward_triton if backend == "triton" else type(self).forward_native

    def forward(self, *args, **kwargs):
        return self._forward(self, *args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_triton(self, *args, **kwargs):
        raise NotImplementedError
