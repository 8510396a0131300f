"""Flash attention for prefill chunks, reading keys and values straight from the paged KV cache.

What: one Triton kernel that computes causal (optionally sliding-window) attention for a flat
batch of prefill chunks. Sequence s brings q_len_s new queries, the last q_len_s of its
context_lens[s] tokens; the tokens before them (a cached prefix, or earlier chunks of the same
prompt) are already in the cache, and so are this chunk's own keys and values (stored before
attention runs). Query i of sequence s sits at absolute position context_lens[s] - q_len_s + i
and sees keys j <= p (and j > p - sliding_window).

Why: the torch reference (`minivllm/attention/torch_ref.py`) gathers every sequence's keys and
values into a padded `[num_seqs, max_context_len, ...]` copy and builds a full mask, which costs
memory traffic and memory proportional to the longest sequence in the batch. Here each program
walks its sequence's block table and reads only the KV tiles it needs, once, from the cache.

How (the fused-attention recipe, on a paged cache):
  - grid = (num_seqs * cdiv(max_query_len, BLOCK_M), num_query_heads): one program owns BLOCK_M
    queries of one sequence and one head; programs past the end of a shorter sequence return;
  - it loops over the keys in tiles of BLOCK_N tokens, from the first key any of its queries may
    see (the window's start) to its last query's position (later keys are in the future); each
    token's slot is block_tables[s, j // block_size] * block_size + j % block_size, so any block
    size works, and blocks outside that range (possibly -1) are never read;
  - online softmax in fp32: keep the running row max m, the running sum l and the unnormalised
    output acc; each new tile rescales them by exp(m_old - m_new); divide by l at the end.
  - GQA: query head h reads KV head h // (Hq // Hkv).

Example::

    out = paged_prefill_attention(q, k_cache, v_cache, meta.cu_seqlens_q, meta.context_lens,
                                  meta.block_tables, meta.max_query_len, scale=head_dim ** -0.5)
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .target import kernel_capability


# Not specialised on values that change from step to step (the block table's width, the number of
# query tiles) or on the alignment of pointers that are offset into the batch's tensors: each
# specialisation would be a fresh compilation (about half a second) in the middle of serving.
@triton.jit(do_not_specialize=["stride_bt", "num_q_tiles"],
            do_not_specialize_on_alignment=["cu_seqlens_q", "context_lens", "block_tables"])
def _prefill_attention_kernel(
    Q, K, V, O, cu_seqlens_q, context_lens, block_tables,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_bt,
    scale, window, num_q_tiles, group,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_WINDOW: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0) // num_q_tiles
    tile = tl.program_id(0) % num_q_tiles
    head = tl.program_id(1)
    q_start = tl.load(cu_seqlens_q + seq)
    q_len = tl.load(cu_seqlens_q + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:     # the grid is sized for the longest chunk; this one is shorter
        return
    ctx_len = tl.load(context_lens + seq)
    kv_head = head // group

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)         # query index within the chunk
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < q_len
    d_valid = offs_d < HEAD_DIM                             # BLOCK_D pads head dims that are not a power of 2
    q_pos = ctx_len - q_len + offs_m                        # absolute positions of the queries
    q_ptrs = Q + (q_start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_valid[:, None] & d_valid[None, :], other=0.0).to(DOT_DTYPE)

    # Keys [lo, hi) are the only ones a query of this tile may see: nothing after the last query
    # (causal), nothing before the first query's window. Tiles outside are never visited.
    hi = ctx_len - q_len + tl.minimum((tile + 1) * BLOCK_M, q_len)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(ctx_len - q_len + tile * BLOCK_M - window + 1, 0)

    # exp2 is the fast path on GPUs: fold log2(e) into the scale once.
    qk_scale = scale * 1.4426950408889634
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_valid = offs_n < hi
        # Paged gather: each key token's block through the block table, then its offset in it.
        # Masked, so the table's -1 entries past `hi` are never used; int64 against overflow in
        # big caches.
        block = tl.load(block_tables + seq * stride_bt + offs_n // BLOCK_SIZE, mask=n_valid, other=0)
        kv_off = block.to(tl.int64) * stride_kb + (offs_n % BLOCK_SIZE) * stride_ks + kv_head * stride_kh
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k = tl.load(K + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(DOT_DTYPE)
        v = tl.load(V + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(DOT_DTYPE)

        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        visible = (offs_n[None, :] <= q_pos[:, None]) & n_valid[None, :]
        if USE_WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        # A large finite negative rather than -inf: a row that sees nothing in this tile (a
        # late query of the tile against early keys, or a padding row) then stays finite instead
        # of giving inf - inf = NaN; its placeholder weight is wiped by alpha = 0 as soon as it
        # sees a real key, and every real query sees at least itself.
        qk = tl.where(visible, qk, -1.0e30)

        # Online softmax: new running max, rescale what was accumulated under the old one.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # p rounded to the cache's dtype, as flash attention does (a no-op pair of casts on a GPU).
        p = p.to(V.dtype.element_ty).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / l_i[:, None]
    o_ptrs = O + (q_start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])


def _tiles(head_dim: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). Under the interpreter the smallest tiles tl.dot
    allows, so small tests still cross several query and key tiles. On a GPU: for 16-bit inputs
    on Ampere or later (sm_80+: 99 KiB and more of shared memory per program) large tiles that keep
    the tensor cores fed. Below sm_80 (as `target.kernel_capability` reports it), sizes that fit a
    T4's (sm_75) 64 KiB: there tl.dot runs on the FMA units, and both its operands are widened to
    fp32 and staged in shared memory, 4 * BLOCK_M * D + 4 * D * BLOCK_N bytes: 48 KiB at head_dim
    128 with 64 x 32 tiles, 32 KiB at head_dim 64 with 64 x 64, as tests/test_kernels_t4.py checks
    by compiling for sm_75 (64 x 64 at head_dim 128 would take all 64 KiB). The stages change
    nothing there: Triton pipelines loads only from sm_80 on. For fp32 (exact "ieee" products on
    the FMA units) small tiles, to stay in registers."""
    if device.type != "cuda":
        return 16, 16, 4, 1
    if dtype == torch.float32:
        return 32, 32, 4, 2
    if kernel_capability(device)[0] >= 8 and head_dim <= 128:
        return 128, 64, 8, 3
    return 64, (64 if head_dim <= 64 else 32), 4, 2


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor,
                            block_tables: torch.Tensor, max_query_len: int, scale: float,
                            sliding_window: int | None = None) -> torch.Tensor:
    """Causal attention of prefill chunks (or decodes) over the paged KV cache.

    q [T, Hq, D] (last dim contiguous); k_cache/v_cache [num_blocks, block_size, Hkv, D]
    contiguous, already holding every context token, this chunk's included; cu_seqlens_q int32
    [S + 1]; context_lens int32 [S]; block_tables int32 [S, max_blocks]. Returns [T, Hq, D] in
    q's dtype.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert q.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert k_cache.stride() == v_cache.stride() and num_heads % num_kv_heads == 0
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    num_seqs = context_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0 or max_query_len == 0:
        return out
    block_m, block_n, num_warps, num_stages = _tiles(head_dim, q.dtype, q.device)
    num_q_tiles = triton.cdiv(max_query_len, block_m)
    # tl.dot multiplies in the inputs' dtype. Triton's interpreter (how CPU tensors run) gets bf16
    # products wrong (it hands numpy the raw bits), so under it the operands are upcast to fp32.
    # fp32 operands are multiplied exactly ("ieee"): Triton's default would be TF32 on Ampere and
    # later GPUs.
    dot_dtype = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}.get(q.dtype, tl.float32)
    if os.environ.get("TRITON_INTERPRET") == "1":
        dot_dtype = tl.float32
    grid = (num_seqs * num_q_tiles, num_heads)
    _prefill_attention_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q, context_lens, block_tables,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        scale, sliding_window or 0, num_q_tiles, num_heads // num_kv_heads,
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, USE_WINDOW=sliding_window is not None,
        DOT_DTYPE=dot_dtype, DOT_PRECISION="ieee" if dot_dtype == tl.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
