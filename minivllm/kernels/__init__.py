"""Fused Triton kernels that replace the torch reference code on the hot path.

Each file is one kernel with its Python wrapper; the torch version it must match lives in
`minivllm.layers.basic` (norm, activation, rotary) or `minivllm.attention.torch_ref` (cache
writes, attention). Without a GPU they run in Triton's interpreter (TRITON_INTERPRET=1), slowly.
Launch settings (tiles, warps, stages) follow the GPU's compute capability, which
MINIVLLM_KERNEL_CAPABILITY=7.5 overrides to launch them as on a T4 (see target.py).
"""
from .decode_attention import paged_decode_attention
from .prefill_attention import paged_prefill_attention
from .rmsnorm import rms_norm
from .rotary import apply_rotary_
from .silu_and_mul import silu_and_mul
from .store_kv import store_kv

__all__ = ["rms_norm", "silu_and_mul", "apply_rotary_", "store_kv", "paged_decode_attention",
           "paged_prefill_attention"]
