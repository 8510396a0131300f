"""Weights quantized when the model loads (vLLM's online "fp8" and "int8"): 8 bits a weight, one scale per output
channel, the decoder layers' linear layers only (not the embedding, not the lm_head).

`quantize_per_channel` maps each row of W to [-448, 448] (e4m3's largest finite value) or [-127, 127] (int8)
by its own absolute maximum, so one outlier costs precision in its row only. `quantized_linear` computes
y = x @ (W_q * scale).T by the fastest path the device has:

- a CPU: the torch reference, x @ W_q.T in x's dtype, then the scales (each column of y has one);
- a GPU, few tokens (or int8): `w8_matmul`, the Triton weight-only kernel: half the bytes of a 16-bit weight;
- a GPU with FP8 (compute capability >= 8.9), fp8 and many tokens: W8A8 through `torch._scaled_mm`, x
  quantized to e4m3 per token, where FP8 tensor cores do twice the 16-bit rate.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
INT8_MAX = 127
DTYPES = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
# From this many tokens a step, fp8 goes through _scaled_mm: below, reading W dominates and the weight-only
# kernel reads the same bytes without quantizing x first.
SCALED_MM_MIN_TOKENS = 64


def quantize_per_channel(weight: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (W_q [N, K] in fp8 e4m3 or int8, scale [N] float32), weight ~ W_q * scale[:, None]."""
    top = FP8_MAX if kind == "fp8" else INT8_MAX
    scale = weight.abs().amax(dim=1).float().clamp(min=1e-12) / top
    scaled = weight.float() / scale[:, None]
    if kind == "int8":
        scaled = scaled.round()
    return scaled.clamp(-top, top).to(DTYPES[kind]), scale


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x_q [M, K] in fp8 e4m3, scale [M, 1] float32), the reference of `per_token_quant_fp8`."""
    scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def dequantize(qweight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (qweight.float() * scale[:, None]).to(dtype)


def quantized_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ (W_q * scale).T (+ bias) -> [..., N] in x's dtype."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    if not x.is_cuda:
        y = (F.linear(x, qweight.to(x.dtype)).float() * scale).to(x.dtype)
    elif qweight.dtype == torch.float8_e4m3fn and x.shape[0] >= SCALED_MM_MIN_TOKENS:
        y = fp8_scaled_mm(x, qweight, scale)
    else:
        from ..kernels import w8_matmul  # triton: imported only on a GPU
        y = w8_matmul(x.contiguous(), qweight, scale)
    if bias is not None:
        y = y + bias
    return y.reshape(*shape[:-1], y.shape[-1])


def fp8_scaled_mm(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """W8A8: x quantized to e4m3 with one scale per token (`per_token_quant_fp8`, one Triton kernel), both
    scales applied by the matmul's epilogue."""
    from ..kernels import per_token_quant_fp8  # triton: imported only on a GPU
    x_q, x_scale = per_token_quant_fp8(x)
    # _scaled_mm wants the second operand column-major: W_q.T of a row-major W_q is.
    return torch._scaled_mm(x_q, qweight.t(), scale_a=x_scale, scale_b=scale[None, :], out_dtype=x.dtype)


def quantize_linear_layers(model: torch.nn.Module, kind: str) -> None:
    """Replace every linear layer's weight (the layers with a `weight_scale`: the decoder's, not the embedding
    or the lm_head) by its quantized version and scales, after loading."""
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            qweight, scale = quantize_per_channel(module.weight.data, kind)
            module.weight = torch.nn.Parameter(qweight, requires_grad=False)
            module.weight_scale = scale
