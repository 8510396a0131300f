"""Paged decode attention in Triton: one new query token per sequence against its paged KV cache.

Why a kernel of its own: a decode step does almost no arithmetic. Each sequence brings one query
and must read every key and value it has cached, so the time of a step is the bytes of KV read
divided by memory bandwidth. Everything here serves that one number:

- no gather: keys and values are read in place from the cache blocks the block table names
  (the torch reference first copies them into a padded tensor, then reads the copy);
- GQA: one program serves all the query heads that share a KV head, so each KV block is read
  once per group, not once per query head (4x fewer bytes for Mistral-7B's 32 / 8 heads);
- sliding window: blocks wholly outside the window are skipped (the engine has freed them);
- split-K ("flash-decoding"): a batch of 2 sequences with 8 KV heads is 16 programs, far too
  few to keep an H200's 132 SMs busy. So a long context is cut into `num_splits` parts read by
  separate programs in parallel, and a second small kernel merges their partial results.

The softmax is computed online, one tile of scores s_j at a time, in fp32 and base 2: keep the
running max m, and rescale what was summed so far when it grows:

    m' = max(m, max_j s_j)
    l' = l 2^(m - m') + sum_j 2^(s_j - m')
    acc' = acc 2^(m - m') + sum_j 2^(s_j - m') v_j

and the output is acc / l. Two partial results (m1, l1, acc1), (m2, l2, acc2) merge the same way,
which is all the split-K reduce kernel does.

Usage (the keys and values of the new tokens are already stored in the cache)::

    out = paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale=D ** -0.5)
    # q [B, Hq, D]; k_cache, v_cache [num_blocks, block_size, Hkv, D];
    # block_tables [B, max_blocks] int32; context_lens [B] int32 -> out [B, Hq, D]

The torch reference it is tested against is `minivllm.attention.torch_ref.paged_attention`.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .target import kernel_capability

LOG2E = 1.4426950408889634  # exp(x) = 2^(x * log2 e): exp2 is the fast instruction


# Not specialised on the block table's width, which changes from step to step outside CUDA graphs
# (each specialisation would be a fresh compilation while serving), nor on the alignment of the
# block tables and lengths, which a mixed step offsets past its prefill chunks.
@triton.jit(do_not_specialize=["stride_bt"],
            do_not_specialize_on_alignment=["block_tables_ptr", "context_lens_ptr"])
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
    qk_scale, window,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_bt,
    stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_IN_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program: sequence `b`, KV head `kvh`, part `split` of the context, all GROUP query heads."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    # Keys j with lo <= j < ctx are visible: the query sits at ctx - 1, the window keeps the last
    # `window` tokens. A padding row (ctx == 0) has no tiles at all, so it loads nothing.
    ctx = tl.load(context_lens_ptr + b)
    lo = tl.maximum(ctx - window, 0)

    # Tiles of BLOCK_N tokens aligned on absolute positions, so that when BLOCK_N == block_size a
    # tile is exactly one cache block. Tiles before lo // BLOCK_N are outside the window: never
    # visited. This sequence's tiles are dealt out to the splits in contiguous runs.
    first_tile = lo // BLOCK_N
    num_tiles = tl.cdiv(ctx, BLOCK_N) - first_tile
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_start = first_tile + split * tiles_per_split
    tile_end = tl.minimum(tile_start + tiles_per_split, first_tile + num_tiles)

    offs_h = tl.arange(0, BLOCK_H)       # query heads of the group, padded to BLOCK_H rows
    offs_d = tl.arange(0, BLOCK_D)       # head dim, padded to a power of 2
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)
    if DOT_IN_FP32:  # only under Triton's interpreter, which multiplies bf16 as raw bits (triton#11584)
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)

    for tile in range(tile_start, tile_end):
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = (offs_n >= lo) & (offs_n < ctx)
        # Each token finds its cache block through the block table. Masked: entries for blocks
        # outside the window or past the context may be -1 and are never read.
        block = tl.load(block_tables_ptr + b * stride_bt + offs_n // BLOCK_SIZE, mask=valid, other=0)
        row = block.to(tl.int64) * stride_kb + (offs_n % BLOCK_SIZE) * stride_kt + kvh * stride_kh
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + row[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + row[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        if DOT_IN_FP32:
            k, v = k.to(tl.float32), v.to(tl.float32)

        # fp32 inputs are multiplied exactly ("ieee"): the default would be TF32 (10-bit mantissa).
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale      # [BLOCK_H, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        # Every visited tile holds at least one visible key, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out_mask = h_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        # The whole context was ours: normalise and write the answer (0 for a padding row).
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # Partial results, [B, Hq, NUM_SPLITS] and [B, Hq, NUM_SPLITS, HEAD_DIM], contiguous fp32.
        # An empty split leaves m = -inf, l = 0, acc = 0, which the merge weighs as nothing.
        ml = (b * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split
        tl.store(part_m_ptr + ml, m_i, mask=h_mask)
        tl.store(part_l_ptr + ml, l_i, mask=h_mask)
        tl.store(part_acc_ptr + ml[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=out_mask)


@triton.jit
def _reduce_kernel(
    part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (sequence, query head): merge the NUM_SPLITS partial softmaxes."""
    b = tl.program_id(0)
    h = tl.program_id(1)
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
    w = tl.exp2(m - m_max)                                  # 0 for empty splits
    l_sum = tl.sum(l * w, axis=0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(l_sum > 0, l_sum, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def _is_hopper(device: torch.device) -> bool:
    """An H100/H200 (sm_90), or a GPU told to launch as one (see `target.kernel_capability`)."""
    return device.type == "cuda" and kernel_capability(device)[0] == 9


def _tile_size(device: torch.device) -> int:
    """Tokens per tile. Each token finds its own block through the block table, so a tile need not
    be one block. On an H100/H200 (sm_90) 128 tokens, with `_warps_and_stages`' 8 warps: the best
    worst case of `scripts/decode_sweep.py`, which timed 18 settings on an H200 twice, at 93-97% of
    the measured bandwidth at batch 64 x 4096 and 256 x 1024 tokens (64-token tiles with Triton's
    default 4 warps and 3 stages: 78% at batch 64 x 4096). Other GPUs, where nothing was timed, get
    64-token tiles, the conservative choice: on a T4 (sm_75, 64 KiB of shared memory per program)
    they need 40 KiB at head_dim 128 in fp16 (tests/test_kernels_t4.py), where sm_90's setting
    would need 72 KiB. Under the interpreter 16, so that small tests cross many tiles and blocks."""
    if device.type != "cuda":
        return 16
    return 128 if _is_hopper(device) else 64


def _warps_and_stages(device: torch.device) -> tuple[int, int]:
    """(num_warps, num_stages) for `_tile_size`'s tiles: 8 warps and 3 stages of loads in flight on
    sm_90 (see `_tile_size`), else 4 warps and 2 stages, the sweep's best with 64-token tiles at
    batch 64 x 4096 and the lighter choice for smaller GPUs. Below sm_80 (a T4) the stages change
    nothing: Triton pipelines loads with the asynchronous copies that sm_80 introduced, so it
    compiles the same code for any num_stages there. The interpreter ignores both."""
    return (8, 3) if _is_hopper(device) else (4, 2)


def _num_programs_to_fill(device: torch.device) -> int:
    """About how many programs keep the device busy: two per SM, so that every SM streams KV from
    more than one program. Under the CPU interpreter a small constant, so the split path is used."""
    if device.type == "cuda":
        return 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, tile: int, device: torch.device) -> int:
    """Split each context when batch x KV heads programs are too few to fill the device, into at
    most 64 parts of at least 2 tiles of the longest possible context. Only shapes go in (not the
    values of context_lens), so the choice needs no host sync and stays fixed while a CUDA graph
    replays with longer contexts; each sequence's own tiles are then dealt out to the parts."""
    wanted = triton.cdiv(_num_programs_to_fill(device), batch * num_kv_heads)
    splits = max(1, min(wanted, triton.cdiv(max_context, 2 * tile), 64))
    # A power of 2: each value is a separate compilation, and the block table's width changes
    # from step to step outside CUDA graphs.
    return 1 << (splits.bit_length() - 1)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           sliding_window: int | None = None, num_splits: int | None = None) -> torch.Tensor:
    """q [B, Hq, D] (the newest token of each sequence) -> out [B, Hq, D] in q's dtype.

    k_cache, v_cache: [num_blocks, block_size, Hkv, D]; block_tables [B, max_blocks] int32;
    context_lens [B] int32, 0 for a padding row (its output is 0); the query sits at position
    context_len - 1. num_splits=None picks the split-K factor from the shapes."""
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_heads % num_kv_heads == 0 and q.stride(2) == 1
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.stride() == v_cache.stride()
    group = num_heads // num_kv_heads
    out = torch.empty(batch, num_heads, head_dim, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out

    tile = _tile_size(q.device)
    if num_splits is None:  # the block table's width (and the window) bounds what a query reads
        max_context = min(block_tables.shape[1] * block_size, sliding_window or 2 ** 62)
        num_splits = choose_num_splits(batch, num_kv_heads, max_context, tile, q.device)
    if num_splits > 1:
        part_m = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    else:
        part_m = part_l = part_acc = out  # unused

    # GQA group as rows of a tl.dot, padded to 16 (the smallest M tl.dot accepts): the padding rows
    # load nothing (masked) and cost only tensor-core time, which a memory-bound kernel has to
    # spare. Broadcast-multiply-and-sum would avoid the padding but builds a [group, tile, D]
    # product in registers and runs on the slower FMA units. (Below sm_80, a T4, Triton's tl.dot
    # itself runs on the FMA units, so there the padding rows cost arithmetic: 16 flops per byte
    # of KV read, against the ~25 flops a T4 can do in the time it reads a byte. Close; untimed.)
    dot_in_fp32 = os.environ.get("TRITON_INTERPRET") == "1" and k_cache.dtype == torch.bfloat16
    block_h = max(16, triton.next_power_of_2(group))
    block_d = max(16, triton.next_power_of_2(head_dim))
    num_warps, num_stages = _warps_and_stages(q.device)
    _decode_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens,
        out, part_m, part_l, part_acc,
        scale * LOG2E, sliding_window or 2 ** 30,   # no window: one longer than any context
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, NUM_SPLITS=num_splits,
        DOT_IN_FP32=dot_in_fp32,
        DOT_PRECISION="ieee" if dot_in_fp32 or k_cache.dtype == torch.float32 else "tf32",
        BLOCK_H=block_h, BLOCK_N=tile, BLOCK_D=block_d,
        num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        _reduce_kernel[(batch, num_heads)](
            part_m, part_l, part_acc, out, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
        )
    return out
