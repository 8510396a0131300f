"""RMSNorm, rotary embeddings and SwiGLU's activation, each a `CustomOp` with a torch reference
(`forward_native`) and a fused Triton kernel (`forward_triton`, imported only when used).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .custom_op import CustomOp


class RMSNorm(CustomOp):
    """x / rms(x) * weight, in float32. With `residual`, first adds it (vLLM's fused "add + norm")
    and returns (normed, new_residual)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward_triton(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        from ..kernels import rms_norm
        return rms_norm(x, self.weight, self.eps, residual)

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is not None:
            x = x + residual
            residual = x
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * x32.to(x.dtype)
        return out if residual is None else (out, residual)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation: silu(gate) * up, with gate and up packed side by side."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(CustomOp):
    """`silu_and_mul` as a layer."""

    def forward_native(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(gate_up)

    def forward_triton(self, gate_up: torch.Tensor) -> torch.Tensor:
        from ..kernels import silu_and_mul as fused_silu_and_mul
        return fused_silu_and_mul(gate_up)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Rotation frequency of each pair of dimensions, with the checkpoint's rope scaling."""
    # float32 like transformers, so the angles match exactly
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    if scaling is None:
        return inv_freq
    kind = scaling["rope_type"]
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":  # long wavelengths slowed by `factor`, short ones kept, smoothed between
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        medium = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return torch.where(medium, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    raise NotImplementedError(f"rope scaling {kind!r} is not supported (supported: linear, llama3)")


class RotaryEmbedding(CustomOp):
    """Rotates q and k by an angle proportional to each token's position (RoPE), in the "rotate half"
    layout of Hugging Face Llama checkpoints; cos/sin are precomputed up to `max_positions`."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None = None):
        super().__init__()
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), rope_inv_freq(head_dim, theta, scaling))
        self.register_buffer("cos", angles.cos(), persistent=False)  # [max_positions, head_dim / 2]
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward_native(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions [T]; q [T, Hq, D]; k [T, Hkv, D] -> rotated q, k."""
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def forward_triton(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        from ..kernels import apply_rotary_
        apply_rotary_(positions, q, k, self.cos, self.sin)
        return q, k


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
