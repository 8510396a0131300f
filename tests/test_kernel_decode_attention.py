"""The Triton paged decode attention kernel against the torch reference (`torch_ref.paged_attention`).

On CPU the kernel runs in Triton's interpreter (the root conftest sets TRITON_INTERPRET=1), so the
shapes are small and odd: block sizes 1, 4, 5, 7, 16, GQA groups 1 to 4, contexts of one token, on
and just past a block boundary, padding rows, sliding windows whose freed blocks hold -1 in the
block table and NaN in the cache (so reading one would show), and forced or automatic split-K."""
from __future__ import annotations

import pytest
import torch

import minivllm.kernels.decode_attention as decode_attention
from minivllm.attention import torch_ref
from minivllm.attention.metadata import AttentionMetadata
from minivllm.kernels.decode_attention import choose_num_splits, paged_decode_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # on a GPU machine the kernel runs compiled
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=5e-3, rtol=5e-3)}


def make_case(context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, window=None,
              device=DEVICE, seed=0):
    """Random queries and a paged cache for an all-decode batch. Returns (q, k, v, tables, lens) for
    the kernel and (k, v, meta) for the reference. The kernel's block table has -1 where a block is
    past the context or wholly outside the window, and its copy of the cache has NaN in those
    blocks; the reference gets valid ids everywhere and a clean cache."""
    g = torch.Generator().manual_seed(seed)
    batch = len(context_lens)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    max_blocks = -(-max(max(context_lens), 1) // block_size) + 1   # one spare entry past every context
    num_blocks = batch * max_blocks + 3
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    ref_tables = torch.randperm(num_blocks, generator=g)[:batch * max_blocks].view(batch, max_blocks).int()
    # q as the engine sees it: a view into a fused qkv projection (rows not contiguous).
    qkv = torch.randn(batch, (num_heads + 2 * num_kv_heads) * head_dim, generator=g).to(dtype)
    q = qkv[:, :num_heads * head_dim].view(batch, num_heads, head_dim)

    tables, k_poison, v_poison = ref_tables.clone(), k_cache.clone(), v_cache.clone()
    pos = torch.arange(max_blocks) * block_size                      # first token of each block
    lo = (lens - window).clamp(min=0) if window else torch.zeros_like(lens)
    freed = (pos[None, :] >= lens[:, None]) | (pos[None, :] + block_size <= lo[:, None])
    k_poison[ref_tables[freed].long()] = float("nan")
    v_poison[ref_tables[freed].long()] = float("nan")
    tables[freed] = -1

    max_len = max(context_lens)
    meta = AttentionMetadata(cu_seqlens_q=torch.arange(batch + 1, dtype=torch.int32), context_lens=lens,
                             slot_mapping=torch.zeros(batch, dtype=torch.int64), block_tables=ref_tables,
                             block_size=block_size, max_query_len=1, max_context_len=max_len,
                             num_decodes=batch, max_decode_context_len=max_len)
    to = lambda *xs: [x.to(device) for x in xs]  # noqa: E731
    meta.cu_seqlens_q, meta.context_lens, meta.block_tables = to(meta.cu_seqlens_q, lens, ref_tables)
    return to(q, k_poison, v_poison, tables, lens), (*to(k_cache, v_cache), meta)


def check(context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, window=None,
          splits=(None, 1, 2, 3), device=DEVICE):
    (q, k, v, tables, lens), (k_ref, v_ref, meta) = make_case(
        context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, window, device)
    scale = head_dim ** -0.5
    ref_meta = torch_ref.TorchAttentionMetadata.build(meta, window)
    ref = torch_ref.paged_attention(q, k_ref, v_ref, ref_meta, scale).float()
    real = lens > 0
    for num_splits in splits:
        out = paged_decode_attention(q, k, v, tables, lens, scale, sliding_window=window, num_splits=num_splits)
        assert out.shape == q.shape and out.dtype == q.dtype
        torch.testing.assert_close(out.float()[real], ref[real], **TOL[dtype], msg=lambda m: f"{num_splits=}: {m}")
        assert (out[~real] == 0).all()                               # padding rows: zeros, no NaN


@pytest.mark.parametrize("block_size, num_heads, num_kv_heads, head_dim, dtype", [
    (1, 2, 2, 64, torch.float32),      # one token per block, no GQA
    (4, 4, 2, 32, torch.float32),      # group 2
    (5, 6, 2, 64, torch.float32),      # odd block size, group 3
    (16, 8, 2, 64, torch.bfloat16),    # the engine's default block, group 4
    (7, 3, 1, 80, torch.bfloat16),     # head dim not a power of 2, group 3
    (32, 4, 1, 32, torch.float32),     # one tile = one 32-token block, group 4
    (256, 2, 1, 16, torch.float32),    # blocks larger than a tile (128 tokens), group 2
])
def test_matches_reference(block_size, num_heads, num_kv_heads, head_dim, dtype):
    b = block_size
    context_lens = [1, b, b + 1, 3 * b + 2, 0, 37]    # one token, on and past a boundary, padding
    check(context_lens, num_heads, num_kv_heads, head_dim, b, dtype)


@pytest.mark.parametrize("block_size, window, context_lens", [
    (4, 8, [8, 9, 12, 23, 3, 0]),     # window on a block boundary: == context, one past, longer
    (4, 6, [6, 7, 13, 30, 1]),        # window not a multiple of the block size
    (5, 7, [7, 8, 26, 41, 2]),        # odd block size
    (16, 20, [20, 33, 64, 70]),       # window across tiles of one block each
    (1, 3, [1, 3, 4, 17]),            # one token per block: all but the last 3 blocks freed
])
def test_sliding_window_skips_freed_blocks(block_size, window, context_lens):
    check(context_lens, 4, 2, 32, block_size, torch.float32, window=window)


def test_automatic_splits_cover_long_contexts():
    # One sequence, one KV head: far too few programs, so the automatic choice splits the context.
    assert choose_num_splits(1, 1, 200, 16, torch.device("cpu")) > 1
    assert choose_num_splits(64, 8, 4096, 16, torch.device("cpu")) == 1
    check([200], 4, 1, 32, 4, torch.float32, splits=(None, 1, 5))
    check([200], 4, 1, 32, 16, torch.bfloat16, window=50, splits=(None, 1))


def test_all_padding_rows_give_zeros():
    (q, k, v, tables, lens), _ = make_case([0, 0, 0], 4, 2, 32, 4, torch.bfloat16)
    for num_splits in (1, 3):
        out = paged_decode_attention(q, k, v, tables, lens, 0.1, num_splits=num_splits)
        assert (out == 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("batch, max_len, dtype, window", [
    (64, 4096, torch.bfloat16, None),     # Mistral-7B shape, a full batch: no split
    (2, 4096, torch.bfloat16, None),      # a small batch: split-K
    (4, 4096, torch.bfloat16, 1000),      # sliding window
    (3, 1000, torch.float16, None),       # fp16, what an older GPU (T4) would run
    (3, 1000, torch.float32, None),       # fp32 must not silently use TF32
])
def test_realistic_shapes_on_the_gpu(batch, max_len, dtype, window):
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(1, max_len + 1, (batch,), generator=g)
    lens[0] = max_len
    check(lens.tolist(), 32, 8, 128, 16, dtype, window=window, splits=(None, 1, 7))


@pytest.mark.parametrize("tile", [64, 128])
def test_gpu_tile_sizes_in_the_interpreter(monkeypatch, tile):
    # A GPU reads 128 tokens per tile (64 before Hopper): several blocks per tile, tiles that
    # straddle a window's start. The interpreter normally uses 16; check the GPU's sizes here too.
    monkeypatch.setattr(decode_attention, "_tile_size", lambda device: tile)
    check([1, 16, 17, 150, 0, 300], 8, 2, 64, 16, torch.float32, splits=(None, 1, 3))
    check([5, 70, 129, 260], 3, 1, 32, 5, torch.bfloat16, splits=(1, 2))
    check([20, 33, 100, 270], 4, 2, 32, 16, torch.float32, window=40, splits=(None, 1, 2))


def test_in_a_mixed_batch_answers_the_one_query_sequences_in_place():
    # q holds every token of the step; cu_seqlens_q says where each sequence's queries are. The decode kernel
    # writes the rows of the sequences with one query (anywhere in the batch) and no other row.
    device = DEVICE
    (q, k, v, tables, lens), _ = make_case([5, 17, 9, 30], 4, 2, 32, 4, torch.float32, None, device)
    alone = paged_decode_attention(q, k, v, tables, lens, 32 ** -0.5)
    q_lens = [1, 3, 1, 2]                                             # sequences 0 and 2 decode
    cu = torch.tensor([0] + q_lens, device=device).cumsum(0).int()
    rows = torch.randn(int(cu[-1]), *q.shape[1:], device=device)
    rows[cu[:-1].long()] = q                                          # each sequence's first query is q's row
    for num_splits in (1, 2):
        out = torch.full_like(rows, 7.0)
        paged_decode_attention(rows, k, v, tables, lens, 32 ** -0.5, num_splits=num_splits, cu_seqlens_q=cu, out=out)
        torch.testing.assert_close(out[[0, 4]], alone[[0, 2]], **TOL[torch.float32])
        assert (out[[1, 2, 3, 5, 6]] == 7.0).all()
