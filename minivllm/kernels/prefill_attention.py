"""Flash attention for prefill chunks, reading keys and values straight from the paged KV cache.

A sequence's q_len queries are the last q_len of its context_lens tokens, all already in the cache;
query position p sees keys j <= p (and j > p - sliding_window). A work item is BLOCK_Q queries of one
sequence times the GQA group of query heads that share one KV head: BLOCK_M = BLOCK_Q x GROUP rows, so each key
tile read serves the whole group (as the decode kernel does). Its program walks key tiles of BLOCK_N tokens
through the block table with an online softmax in fp32. The programs are persistent (about two per
multiprocessor, whatever the batch): each counts the items from cu_seqlens_q and takes every num_programs-th,
so the launch depends on T and S only and no program is spent on a sequence that has no item (a decode's, in
a mixed batch).
The cache may be fp8 (e4m3) with one scale per tensor (vLLM's uncalibrated default is 1.0): it holds
x / scale, read as stored * scale: each tile is widened exactly to q's dtype, and k_scale multiplies the
scores, v_scale the output.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .paged_kv import load_kv_tile
from .target import kernel_capability


# Not specialised on values that change between steps: each specialisation is a fresh compilation.
@triton.jit(do_not_specialize=["stride_bt", "num_seqs"],
            do_not_specialize_on_alignment=["cu_seqlens_q", "context_lens", "block_tables"])
def _prefill_attention_kernel(
    Q, K, V, O, cu_seqlens_q, context_lens, block_tables,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_bt,
    scale, window, num_seqs, num_kv_heads, group, v_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
    USE_WINDOW: tl.constexpr, MIN_QUERY_LEN: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    FP8: tl.constexpr,
):
    # The work items: each tile of BLOCK_Q queries of each sequence of at least MIN_QUERY_LEN queries, for
    # each KV head. Every program counts them from cu_seqlens_q and takes every num_programs-th.
    seqs = tl.arange(0, BLOCK_S)
    q_starts = tl.load(cu_seqlens_q + seqs, mask=seqs < num_seqs, other=0)
    q_lens = tl.load(cu_seqlens_q + seqs + 1, mask=seqs < num_seqs, other=0) - q_starts
    num_tiles = tl.where(q_lens >= MIN_QUERY_LEN, (q_lens + BLOCK_Q - 1) // BLOCK_Q, 0)
    tiles_end = tl.cumsum(num_tiles, 0)  # sequence s owns tiles [tiles_end[s] - num_tiles[s], tiles_end[s])
    for item in range(tl.program_id(0), tl.sum(num_tiles, 0) * num_kv_heads, tl.num_programs(0)):
        t = item // num_kv_heads
        kv_head = item % num_kv_heads
        seq = tl.sum((tiles_end <= t).to(tl.int32), 0)
        tile = t - tl.sum(tl.where(seqs == seq, tiles_end - num_tiles, 0), 0)
        q_start = tl.load(cu_seqlens_q + seq)
        q_len = tl.load(cu_seqlens_q + seq + 1) - q_start
        ctx_len = tl.load(context_lens + seq)

        # Row r of the tile: query tile * BLOCK_Q + r // GROUP_PAD, head r % GROUP_PAD of the group.
        rows = tl.arange(0, BLOCK_M)
        offs_m = tile * BLOCK_Q + rows // GROUP_PAD
        head = kv_head * group + rows % GROUP_PAD
        offs_d = tl.arange(0, BLOCK_D)
        m_valid = (offs_m < q_len) & (rows % GROUP_PAD < group)
        d_valid = offs_d < HEAD_DIM
        q_pos = ctx_len - q_len + offs_m
        q_ptrs = Q + (q_start + offs_m)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=m_valid[:, None] & d_valid[None, :], other=0.0).to(DOT_DTYPE)

        # Keys [lo, hi): up to the last query (causal), from the first query's window.
        hi = ctx_len - q_len + tl.minimum((tile + 1) * BLOCK_Q, q_len)
        lo = 0
        if USE_WINDOW:
            lo = tl.maximum(ctx_len - q_len + tile * BLOCK_Q - window + 1, 0)

        qk_scale = scale * 1.4426950408889634
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_valid = offs_n < hi
            k, v = load_kv_tile(K, V, block_tables + seq * stride_bt, offs_n, n_valid, offs_d, d_valid, kv_head,
                                stride_kb, stride_ks, stride_kh, BLOCK_SIZE, FP8, Q.dtype.element_ty)
            k, v = k.to(DOT_DTYPE), v.to(DOT_DTYPE)

            qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            visible = (offs_n[None, :] <= q_pos[:, None]) & n_valid[None, :]
            if USE_WINDOW:
                visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
            # Finite, not -inf: a row that sees nothing in this tile must not give inf - inf = NaN.
            qk = tl.where(visible, qk, -1.0e30)

            m_new = tl.maximum(m_i, tl.max(qk, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            # p rounded to v's dtype (q's for an fp8 cache), as flash attention does.
            p = p.to(Q.dtype.element_ty if FP8 else V.dtype.element_ty).to(DOT_DTYPE)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
            m_i = m_new

        if FP8:
            acc = acc * v_scale
        out = acc / l_i[:, None]
        o_ptrs = O + (q_start + offs_m)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])


def _tiles(head_dim: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). Below sm_80 tl.dot stages both operands as fp32,
    4 * (BLOCK_M + BLOCK_N) * D bytes, which must fit a T4's 64 KiB (tests/test_kernels_t4.py)."""
    if device.type != "cuda":
        return 16, 16, 4, 1
    if dtype == torch.float32:
        return 32, 32, 4, 2
    if kernel_capability(device)[0] >= 8 and head_dim <= 128:
        return 64, 64, 4, 3
    return 64, (64 if head_dim <= 64 else 32), 4, 2


@functools.cache  # asked at every launch
def _num_programs(device: torch.device) -> int:
    """Two persistent programs per multiprocessor on a GPU; three under the interpreter, which runs them one
    after the other (enough to test that they share the work out)."""
    if device.type != "cuda":
        return 3
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor,
                            block_tables: torch.Tensor, scale: float, sliding_window: int | None = None,
                            k_scale: float = 1.0, v_scale: float = 1.0, out: torch.Tensor | None = None,
                            min_query_len: int = 1) -> torch.Tensor:
    """Causal attention of prefill chunks (or decodes) over the paged KV cache.

    q [T, Hq, D]; k_cache/v_cache [num_blocks, block_size, Hkv, D], already holding every context
    token; cu_seqlens_q int32 [S + 1]; context_lens int32 [S]; block_tables int32 [S, max_blocks].
    Returns out [T, Hq, D] in q's dtype (written in place if given), skipping sequences of fewer than
    `min_query_len` queries (2: those of one query are left to the decode kernel). The launch depends on
    T and S only, not on how the tokens are shared out: a CUDA graph can replay it for any batch of that
    size. An fp8 (e4m3) cache is read as stored * k_scale (v_scale); other caches ignore the scales.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert q.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert k_cache.stride() == v_cache.stride() and num_heads % num_kv_heads == 0
    if out is None:
        out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    num_seqs = context_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    block_m, block_n, num_warps, num_stages = _tiles(head_dim, q.dtype, q.device)
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)   # the padding heads' rows are masked
    block_m = max(block_m, group_pad)           # at least one query a tile
    # The interpreter gets bf16 products wrong, so there operands are upcast; fp32 is multiplied as "ieee".
    dot_dtype = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}.get(q.dtype, tl.float32)
    if os.environ.get("TRITON_INTERPRET") == "1":
        dot_dtype = tl.float32
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8:  # numpy, under the interpreter, has no fp8: the kernel takes the bytes
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    most = (triton.cdiv(num_tokens, block_m // group_pad) + num_seqs) * num_kv_heads  # any split of T into S
    grid = (min(most, _num_programs(q.device)),)
    _prefill_attention_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q, context_lens, block_tables,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        scale * (k_scale if fp8 else 1.0), sliding_window or 0, num_seqs, num_kv_heads, group, v_scale,
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_SIZE=block_size,
        GROUP_PAD=group_pad, BLOCK_Q=block_m // group_pad, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_S=max(16, triton.next_power_of_2(num_seqs)),
        USE_WINDOW=sliding_window is not None, MIN_QUERY_LEN=min_query_len,
        DOT_DTYPE=dot_dtype, DOT_PRECISION="ieee" if dot_dtype == tl.float32 else "tf32", FP8=fp8,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
