"""The roofline: how fast the hardware *could* run a model, from bytes, FLOPs and two measured rates.

Every step of LLM inference must at least read all the weights (and the KV cache of the batch) from
GPU memory, and must at least do the matmul FLOPs. So a step takes at least
``max(bytes / bandwidth, flops / matmul_rate)``. At batch 1 the bytes win by far: decoding is
memory-bound, which is why batching many requests into one step is the central optimization of vLLM.
This module turns that argument into numbers, so a measured throughput can be reported as a fraction
of what the GPU allows rather than as a bare tok/s.

Example (Mistral-7B shape, bf16, on the H200 the project measured: 4.28 TB/s, 799 TFLOP/s)::

    bw, rate = H200_BANDWIDTH_BPS, H200_MATMUL_FLOPS
    weight_bytes(MISTRAL_7B) / 1e9                      # 14.48 GB, read once per step
    roofline_tok_s(MISTRAL_7B, 1, 200, bw, rate)        # ~295 tok/s: batch 1 is memory-bound
    roofline_tok_s(MISTRAL_7B, 64, 200, bw, rate)       # ~16,900 tok/s: 64 tokens for little more reading
    max_batch_size(MISTRAL_7B, A10_MEMORY_BYTES, 4096)  # 21 sequences of 4K tokens fit on a 24 GB A10...
    max_batch_size(replace(MISTRAL_7B, num_kv_heads=32), A10_MEMORY_BYTES, 4096)  # ...4 without GQA (4.5)

What the model counts: Llama/Mistral layers (no biases, SwiGLU MLP, RMSNorm), linear-layer FLOPs at
2 per weight per token, attention FLOPs at 4 * heads * head_dim per token per context token per layer.
It ignores what is small (norms, RoPE, softmax, sampling FLOPs; activations' memory traffic) and
assumes perfect overlap of memory and compute, so a real engine should land below it.
"""

from dataclasses import dataclass, fields

import torch

from minivllm_lab.bench.metrics import cuda_time_ms, median

# Measured on the project's H200 on 2026-11-29: device-to-device copy,
# bytes read + written, and a bf16 8192^3 matmul. Measured, not datasheet, numbers: real kernels
# don't reach the datasheet's 4.8 TB/s and 989 TFLOP/s, and a roofline should be reachable.
H200_BANDWIDTH_BPS = 4.28e12
H200_MATMUL_FLOPS = 799e12
# An A10 is sold as "24 GB"; its memory chips hold 24 GiB. Usable memory is a little less (ECC,
# the CUDA context): the reserve arguments of kv_cache_capacity_tokens account for that.
A10_MEMORY_BYTES = 24 * 2**30


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama/Mistral-style decoder that decide its bytes and FLOPs (values don't matter)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool

    # Hugging Face's config.json names, so a transformers config works as well as the engine's.
    _HF_NAMES = {
        "num_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "num_kv_heads": "num_key_value_heads",
    }

    @classmethod
    def from_config(cls, cfg) -> "ModelShape":
        """Read the fields from any object with attributes of the same names (e.g. the engine's ModelConfig)."""
        values = {}
        for f in fields(cls):
            value = getattr(cfg, f.name, None)
            if value is None and f.name in cls._HF_NAMES:
                value = getattr(cfg, cls._HF_NAMES[f.name], None)
            values[f.name] = value
        if values["num_kv_heads"] is None:
            values["num_kv_heads"] = values["num_heads"]
        if values["head_dim"] is None:
            values["head_dim"] = values["hidden_size"] // values["num_heads"]
        if values["tie_word_embeddings"] is None:
            values["tie_word_embeddings"] = False
        missing = [k for k, v in values.items() if v is None]
        if missing:
            raise ValueError(f"config lacks {missing}")
        return cls(**values)


MISTRAL_7B = ModelShape(32, 4096, 32, 8, 128, 14336, 32000, False)


def _layer_matmul_params(shape: ModelShape) -> int:
    h, q, kv = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    attention = h * q + 2 * h * kv + q * h  # q, k, v and o projections
    mlp = 3 * h * shape.intermediate_size  # gate, up and down projections (SwiGLU)
    return attention + mlp


def num_params(shape: ModelShape) -> int:
    """Parameters: embedding, layers (projections + 2 RMSNorms each), final norm, lm_head if untied."""
    h = shape.hidden_size
    embedding = shape.vocab_size * h
    layers = shape.num_layers * (_layer_matmul_params(shape) + 2 * h)
    lm_head = 0 if shape.tie_word_embeddings else shape.vocab_size * h
    return embedding + layers + h + lm_head


def weight_bytes(shape: ModelShape, dtype_bytes: int = 2) -> int:
    """Bytes of all weights: what one forward step must read from memory at least once."""
    return num_params(shape) * dtype_bytes


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int = 2) -> int:
    """KV cache bytes one token occupies: a key and a value vector per KV head, in every layer."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * dtype_bytes


def _attention_flops(shape: ModelShape, context_len: float) -> float:
    # q @ k^T and probs @ v, each 2 FLOPs per head dim per context token, for every query head
    # (with GQA the KV heads are shared, the query heads are not: FLOPs don't shrink, bytes do).
    return 4 * shape.num_layers * shape.num_heads * shape.head_dim * context_len


def flops_per_token(shape: ModelShape, context_len: float) -> float:
    """FLOPs to run one token attending to ``context_len`` tokens: 2 per matmul weight + attention.

    The matmul weights are the layers' projections and the lm_head (used even when tied to the
    embedding, whose lookup costs no FLOPs).
    """
    matmul_params = shape.num_layers * _layer_matmul_params(shape) + shape.vocab_size * shape.hidden_size
    return 2 * matmul_params + _attention_flops(shape, context_len)


def _step_time_s(shape, batch, total_context, bandwidth_Bps, flops_per_s, dtype_bytes):
    # total_context = sum of the batch's context lengths: the KV bytes read and the attention FLOPs
    # both grow with it, so one number per step is exact, not an approximation by a mean.
    nbytes = weight_bytes(shape, dtype_bytes) + total_context * kv_bytes_per_token(shape, dtype_bytes)
    flops = batch * flops_per_token(shape, 0) + _attention_flops(shape, total_context)
    return max(nbytes / bandwidth_Bps, flops / flops_per_s)


def decode_step_time_s(
    shape: ModelShape,
    batch: int,
    mean_context: float,
    bandwidth_Bps: float,
    flops_per_s: float,
    dtype_bytes: int = 2,
) -> float:
    """Least time of one decode step of ``batch`` sequences with ``mean_context`` tokens each.

    ``max(bytes / bandwidth, FLOPs / rate)`` with bytes = weights + batch * context * KV bytes per
    token, and FLOPs = batch * flops_per_token(context).
    """
    return _step_time_s(shape, batch, batch * mean_context, bandwidth_Bps, flops_per_s, dtype_bytes)


def roofline_tok_s(
    shape: ModelShape,
    batch: int,
    mean_context: float,
    bandwidth_Bps: float,
    flops_per_s: float,
    dtype_bytes: int = 2,
) -> float:
    """Most decode tokens per second at this batch size: one token per sequence per step."""
    return batch / decode_step_time_s(shape, batch, mean_context, bandwidth_Bps, flops_per_s, dtype_bytes)


def prefill_flops(shape: ModelShape, prompt_len: int) -> float:
    """FLOPs to prefill one prompt: every token through the layers, attending causally (token i sees
    i + 1 tokens), and the lm_head once, for the last token, which gives the first output token."""
    layer_flops = 2 * shape.num_layers * _layer_matmul_params(shape) * prompt_len
    causal_context = prompt_len * (prompt_len + 1) / 2
    return layer_flops + _attention_flops(shape, causal_context) + 2 * shape.vocab_size * shape.hidden_size


def workload_roofline_tok_s(
    shape: ModelShape,
    prompt_lens: list[int],
    output_lens: list[int],
    bandwidth_Bps: float,
    flops_per_s: float,
    max_batch: int | None = None,
    dtype_bytes: int = 2,
) -> float:
    """An idealized upper bound on output tokens/s for a whole offline workload.

    Assumptions, each in the engine's favour, so that a real engine should land below the number:

    - prefill is pure compute at the matmul rate: total time = sum of ``prefill_flops`` / rate
      (prompts prefilled together share each weight read, which hides under the FLOPs);
    - prefill gives each request its first output token; the other ``output_len - 1`` come from
      decode steps;
    - decode runs all requests together in one batch (or ``max_batch`` at a time, a finished request's
      slot going to the next waiting one at once); the batch shrinks as requests finish;
    - each decode step takes ``max(bytes / bandwidth, FLOPs / rate)`` with the batch's current
      contexts: the weights read once per step, every running sequence's KV cache read once;
    - nothing else costs time: no scheduling, sampling, launch overhead, or memory limit on the batch.
    """
    if len(prompt_lens) != len(output_lens):
        raise ValueError("prompt_lens and output_lens differ in length")
    total_s = sum(prefill_flops(shape, p) for p in prompt_lens) / flops_per_s
    # One entry per request that still needs decode steps: [current context, steps left]. The first
    # decode step feeds the prefill's output token, so it attends to prompt_len + 1 tokens.
    waiting = [[p + 1, o - 1] for p, o in zip(prompt_lens, output_lens) if o > 1]
    waiting.reverse()  # pop() from the end takes requests in their original order
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    limit = max_batch or len(waiting)
    running = []
    while running or waiting:
        while waiting and len(running) < limit:
            running.append(waiting.pop())
        total_context = sum(ctx for ctx, _ in running)
        total_s += _step_time_s(shape, len(running), total_context, bandwidth_Bps, flops_per_s, dtype_bytes)
        for seq in running:
            seq[0] += 1
            seq[1] -= 1
        running = [seq for seq in running if seq[1] > 0]
    return sum(output_lens) / total_s


def kv_cache_capacity_tokens(
    shape: ModelShape,
    gpu_bytes: float,
    dtype_bytes: int = 2,
    memory_fraction: float = 1.0,
    reserve_bytes: float = 0.0,
) -> int:
    """Tokens of KV cache that fit in the memory left after the weights.

    ``memory_fraction`` of ``gpu_bytes`` is usable (vLLM's ``gpu_memory_utilization``, 0.9 there),
    less ``reserve_bytes`` for activations and the CUDA context. The defaults give the pure
    back-of-envelope number: all memory, weights subtracted, nothing else.

    Comparing attention variants with ``replace(shape, num_kv_heads=...)`` changes the weights too
    (the K and V projections grow with the KV heads), as it would in a real model.
    """
    free = gpu_bytes * memory_fraction - reserve_bytes - weight_bytes(shape, dtype_bytes)
    return max(0, int(free // kv_bytes_per_token(shape, dtype_bytes)))


def max_batch_size(shape: ModelShape, gpu_bytes: float, context_len: int, **capacity_kwargs) -> int:
    """How many sequences of ``context_len`` tokens fit in the KV cache at once (whole sequences only)."""
    return kv_cache_capacity_tokens(shape, gpu_bytes, **capacity_kwargs) // context_len


def measure_bandwidth_Bps(device="cuda", nbytes: int = 2**30, warmup: int = 3, repeats: int = 10) -> float:
    """Memory bandwidth as a device-to-device copy sees it: (bytes read + bytes written) / median time.

    A copy is the simplest kernel that streams memory at full speed, and it is what the weights' and
    KV cache's reads are bounded by. Use at least a few hundred MB on a GPU, so its caches don't help.
    """
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = median(cuda_time_ms(lambda: dst.copy_(src), warmup, repeats, device=device))
    return 2 * nbytes / (ms / 1e3)


def layers_matmul_flops(shape: ModelShape, num_tokens: int) -> float:
    """FLOPs of `num_tokens` tokens through the layers' projections: a prompt chunk's matmuls (its rows do not
    reach the lm_head unless they sample)."""
    return 2 * num_tokens * shape.num_layers * _layer_matmul_params(shape)


def measure_matmul_flops(
    device="cuda", n: int = 8192, dtype=torch.bfloat16, warmup: int = 3, repeats: int = 10
) -> float:
    """Matmul FLOP/s: 2 * n^3 FLOPs of an n x n x n product / median time.

    n = 8192 is large enough to keep every tensor core busy; the rate is what prefill approaches.
    Keep runs short: on the H200 the rate fell from ~790 to ~680 TFLOP/s over a few hundred
    back-to-back products, as the clocks drop under sustained power.
    """
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    ms = median(cuda_time_ms(lambda: torch.matmul(a, b, out=out), warmup, repeats, device=device))
    return 2 * n**3 / (ms / 1e3)
