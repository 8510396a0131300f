"""Fused Triton kernels for the hot path, each matching a torch reference in `minivllm.layers.basic`
or `minivllm.attention.torch_ref`. Without a GPU they run in Triton's interpreter (TRITON_INTERPRET=1).
"""
from .decode_attention import paged_decode_attention
from .fp8_quant import per_token_quant_fp8
from .prefill_attention import paged_prefill_attention
from .rmsnorm import rms_norm
from .rotary import apply_rotary_
from .silu_and_mul import silu_and_mul
from .store_kv import store_kv
from .w8_matmul import w8_matmul

__all__ = ["rms_norm", "silu_and_mul", "apply_rotary_", "store_kv", "paged_decode_attention",
           "paged_prefill_attention", "w8_matmul", "per_token_quant_fp8"]
