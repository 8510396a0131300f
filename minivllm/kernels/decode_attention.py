"""Paged decode attention in Triton: one new query token per sequence against its paged KV cache.

Decode is memory-bound, so KV is read in place through the block table, one program serves a
whole GQA group, tiles before the sliding window are skipped, and long contexts are split into
parts (split-K) that `_reduce_kernel` merges. Online softmax in fp32, base 2 (exp2).
The cache may be fp8 (e4m3) with one scale per tensor (vLLM's uncalibrated default is 1.0): it holds
x / scale, read as stored * scale: each tile is widened exactly to q's dtype, and k_scale multiplies the scores,
v_scale the output.
Reference: `minivllm.attention.torch_ref.paged_attention`.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .paged_kv import load_kv_tile
from .target import kernel_capability

LOG2E = 1.4426950408889634  # exp(x) = 2^(x * log2 e)


# Not specialised on values that change between steps: each specialisation is a fresh compilation.
@triton.jit(do_not_specialize=["stride_bt"],
            do_not_specialize_on_alignment=["block_tables_ptr", "context_lens_ptr"])
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, context_lens_ptr, cu_seqlens_ptr,
    out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
    qk_scale, window, v_scale,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_bt,
    stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_IN_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr, FP8: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program: sequence `b`, KV head `kvh`, part `split` of the context, all GROUP query heads."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    q_row = tl.load(cu_seqlens_ptr + b)  # the sequence's query, in q and out
    if tl.load(cu_seqlens_ptr + b + 1) - q_row != 1:  # a prompt chunk (the prefill kernel's), or no query at all
        return

    # Keys lo <= j < ctx are visible. A padding row (ctx == 0) has no tiles.
    ctx = tl.load(context_lens_ptr + b)
    lo = tl.maximum(ctx - window, 0)

    # Tiles (aligned on absolute positions) are dealt out to the splits in contiguous runs.
    first_tile = lo // BLOCK_N
    num_tiles = tl.cdiv(ctx, BLOCK_N) - first_tile
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_start = first_tile + split * tiles_per_split
    tile_end = tl.minimum(tile_start + tiles_per_split, first_tile + num_tiles)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h
    q = tl.load(q_ptr + q_row * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)
    if DOT_IN_FP32:  # only under Triton's interpreter, which multiplies bf16 as raw bits (triton#11584)
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)

    for tile in range(tile_start, tile_end):
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = (offs_n >= lo) & (offs_n < ctx)
        k, v = load_kv_tile(k_ptr, v_ptr, block_tables_ptr + b * stride_bt, offs_n, valid, offs_d, d_mask, kvh,
                            stride_kb, stride_kt, stride_kh, BLOCK_SIZE, FP8, q_ptr.dtype.element_ty)
        if DOT_IN_FP32:
            k, v = k.to(tl.float32), v.to(tl.float32)

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale      # [BLOCK_H, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        # Every visited tile holds a visible key, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if FP8:
        acc = acc * v_scale
    out_mask = h_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # 0 for a padding row
        tl.store(out_ptr + q_row * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # An empty split (m = -inf, l = 0) weighs nothing in the merge.
        ml = (b * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split
        tl.store(part_m_ptr + ml, m_i, mask=h_mask)
        tl.store(part_l_ptr + ml, l_i, mask=h_mask)
        tl.store(part_acc_ptr + ml[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=out_mask)


@triton.jit
def _reduce_kernel(
    part_m_ptr, part_l_ptr, part_acc_ptr, cu_seqlens_ptr, out_ptr,
    stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (sequence, query head): merge the NUM_SPLITS partial softmaxes."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    q_row = tl.load(cu_seqlens_ptr + b)
    if tl.load(cu_seqlens_ptr + b + 1) - q_row != 1:  # skipped by _decode_kernel too
        return
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    d_mask = offs_d < HEAD_DIM
    base = (b * NUM_HEADS + h) * NUM_SPLITS + offs_s
    m = tl.load(part_m_ptr + base, mask=s_mask, other=float("-inf"))
    l = tl.load(part_l_ptr + base, mask=s_mask, other=0.0)
    acc = tl.load(part_acc_ptr + base[:, None] * HEAD_DIM + offs_d[None, :],
                  mask=s_mask[:, None] & d_mask[None, :], other=0.0)

    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)   # padding row: every split empty
    w = tl.exp2(m - m_max)
    l_sum = tl.sum(l * w, axis=0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(l_sum > 0, l_sum, 1.0)
    tl.store(out_ptr + q_row * stride_ob + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def _is_hopper(device: torch.device) -> bool:
    """An sm_90 GPU, or one told to launch as one (see `target.kernel_capability`)."""
    return device.type == "cuda" and kernel_capability(device)[0] == 9


def _tile_size(device: torch.device) -> int:
    """Tokens per tile: 128 on sm_90 (`scripts/decode_sweep.py`), 64 elsewhere (fits a T4), 16 under
    the interpreter so small tests cross many tiles."""
    if device.type != "cuda":
        return 16
    return 128 if _is_hopper(device) else 64


def _warps_and_stages(device: torch.device) -> tuple[int, int]:
    """(num_warps, num_stages) for `_tile_size`'s tiles."""
    return (8, 3) if _is_hopper(device) else (4, 2)


def _num_programs_to_fill(device: torch.device) -> int:
    """Two programs per SM (8 under the interpreter, so the split path is tested)."""
    if device.type == "cuda":
        return 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, tile: int, device: torch.device) -> int:
    """Split each context when batch x KV heads programs are too few to fill the device (at most 64
    parts of at least 2 tiles). Uses shapes only: no host sync, and fixed while a CUDA graph replays."""
    wanted = triton.cdiv(_num_programs_to_fill(device), batch * num_kv_heads)
    splits = max(1, min(wanted, triton.cdiv(max_context, 2 * tile), 64))
    # A power of 2: each value is a separate compilation.
    return 1 << (splits.bit_length() - 1)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           sliding_window: int | None = None, num_splits: int | None = None,
                           k_scale: float = 1.0, v_scale: float = 1.0, cu_seqlens_q: torch.Tensor | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, Hq, D] (each sequence's newest token, at position context_len - 1) -> out [B, Hq, D].

    k_cache, v_cache [num_blocks, block_size, Hkv, D]; block_tables [B, max_blocks] and context_lens
    [B] int32 (0 for a padding row). num_splits=None picks the split-K factor. An fp8 (e4m3) cache
    is read as stored * k_scale (v_scale); other caches ignore the scales.
    In a batch that mixes decodes with prompt chunks, q and out are the batch's [T, Hq, D] and
    cu_seqlens_q [B + 1] says where each sequence's queries are: the kernel answers the sequences of
    one query, in place in `out`, and leaves the others to the prefill kernel."""
    num_heads, head_dim = q.shape[1:]
    batch = context_lens.shape[0]
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_heads % num_kv_heads == 0 and q.stride(2) == 1
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.stride() == v_cache.stride()
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if batch == 0:
        return out
    if cu_seqlens_q is None:
        assert q.shape[0] == batch, "without cu_seqlens_q, q holds one query per sequence"
        cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device)

    tile = _tile_size(q.device)
    if num_splits is None:
        max_context = min(block_tables.shape[1] * block_size, sliding_window or 2 ** 62)
        num_splits = choose_num_splits(batch, num_kv_heads, max_context, tile, q.device)
    if num_splits > 1:
        part_m = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    else:
        part_m = part_l = part_acc = out  # unused

    fp8 = k_cache.dtype == torch.float8_e4m3fn
    dtype = q.dtype if fp8 else k_cache.dtype   # tl.dot's operands: fp8 is widened to q's dtype
    if fp8:  # numpy, under the interpreter, has no fp8: the kernel takes the bytes
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    # The GQA group is tl.dot's M dimension, padded to its minimum of 16; padding rows are masked.
    dot_in_fp32 = os.environ.get("TRITON_INTERPRET") == "1" and dtype == torch.bfloat16
    block_h = max(16, triton.next_power_of_2(group))
    block_d = max(16, triton.next_power_of_2(head_dim))
    num_warps, num_stages = _warps_and_stages(q.device)
    _decode_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q,
        out, part_m, part_l, part_acc,
        scale * LOG2E * (k_scale if fp8 else 1.0), sliding_window or 2 ** 30,   # no window: longer than any context
        v_scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, NUM_SPLITS=num_splits,
        DOT_IN_FP32=dot_in_fp32,
        DOT_PRECISION="ieee" if dot_in_fp32 or dtype == torch.float32 else "tf32", FP8=fp8,
        BLOCK_H=block_h, BLOCK_N=tile, BLOCK_D=block_d,
        num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        _reduce_kernel[(batch, num_heads)](
            part_m, part_l, part_acc, cu_seqlens_q, out, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
        )
    return out
