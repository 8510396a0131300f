"""CustomOp (vLLM's pattern): a layer with a torch reference (`forward_native`) and a Triton kernel
(`forward_triton`); `set_backend` binds one as the forward when the model is built.
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
        # The class's function: a bound method kept on the module would be a reference cycle.
        self._forward = type(self).forward_triton if backend == "triton" else type(self).forward_native

    def forward(self, *args, **kwargs):
        return self._forward(self, *args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_triton(self, *args, **kwargs):
        raise NotImplementedError
