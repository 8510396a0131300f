"""The Triton prefill-chunk attention kernel against the torch reference (`paged_attention`).

On CPU the kernel runs in Triton's interpreter (the root conftest sets TRITON_INTERPRET), so the
shapes are small and odd: several sequences per batch with different chunk lengths and different
earlier context, odd block sizes, GQA groups 1-5 and 32, sliding windows that cut through blocks.

Two traps prove the kernel reads only what it must: its block table has -1 for blocks past the
end of each sequence and for blocks entirely outside the window (the cache sits one block into a
buffer whose block 0 is NaN, so reading block -1 poisons the output), and its copy of the cache
holds NaN in every slot no query may see. The reference gets a clean cache and valid block ids.
"""
from __future__ import annotations

import math

import pytest
import torch

import minivllm.kernels.prefill_attention as prefill_attention
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.torch_ref import TorchAttentionMetadata, paged_attention
from minivllm.kernels.prefill_attention import paged_prefill_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(q_lens, earlier, block_size, num_heads, num_kv_heads, head_dim, dtype, window=None,
              seed=0, device=DEVICE):
    """Random queries and cache for chunks of `q_lens` tokens after `earlier` tokens of context.
    Returns (kernel inputs as a dict, reference metadata, clean k/v caches for the reference)."""
    g = torch.Generator().manual_seed(seed)
    ctx = [e + n for e, n in zip(earlier, q_lens)]
    blocks_per_seq = [math.ceil(c / block_size) for c in ctx]
    max_blocks = max(blocks_per_seq) + 1                     # at least one -1 column in the kernel's table
    num_blocks = sum(blocks_per_seq) + 3
    ids = torch.randperm(num_blocks, generator=g)
    ref_table = torch.randint(0, num_blocks, (len(ctx), max_blocks), generator=g)  # valid everywhere
    table = torch.full((len(ctx), max_blocks), -1)
    k = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    v = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    # The kernel's cache: NaN except where some query of the sequence may look.
    k_kernel = torch.full((num_blocks + 1, block_size, num_kv_heads, head_dim), float("nan"))
    v_kernel = k_kernel.clone()
    used = 0
    for s, (c, e, nb) in enumerate(zip(ctx, earlier, blocks_per_seq)):
        ref_table[s, :nb] = ids[used:used + nb]
        used += nb
        first_key = 0 if window is None else max(0, e - window + 1)   # the first query's window start
        for b in range(nb):
            if (b + 1) * block_size > first_key:                        # else the block is freed: -1
                table[s, b] = ref_table[s, b]
        for j in range(first_key, c):
            blk, off = ref_table[s, j // block_size] + 1, j % block_size
            k_kernel[blk, off], v_kernel[blk, off] = k[blk - 1, off], v[blk - 1, off]

    cu = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    qkv = torch.randn(cu[-1].item(), num_heads + 2 * num_kv_heads, head_dim, generator=g)
    to = dict(device=device, dtype=dtype)
    q = qkv.to(**to)[:, :num_heads]                          # a strided view, as the model passes it
    inputs = dict(q=q, k_cache=k_kernel.to(**to)[1:], v_cache=v_kernel.to(**to)[1:],
                  cu_seqlens_q=cu.to(device), context_lens=torch.tensor(ctx, dtype=torch.int32, device=device),
                  block_tables=table.to(torch.int32).to(device),
                  scale=head_dim ** -0.5, sliding_window=window)
    meta = AttentionMetadata(cu_seqlens_q=cu.to(device), context_lens=inputs["context_lens"],
                             slot_mapping=torch.zeros(cu[-1].item(), dtype=torch.int64, device=device),
                             block_tables=ref_table.to(torch.int32).to(device), block_size=block_size,
                             max_query_len=max(q_lens), max_context_len=max(ctx), num_decodes=0)
    return inputs, meta, k.to(**to), v.to(**to), table


def check(inputs, meta, k, v, atol, rtol):
    out = paged_prefill_attention(**inputs)
    assert out.shape == inputs["q"].shape and out.dtype == inputs["q"].dtype
    # The reference in float32 on the same (possibly rounded) inputs.
    ref = paged_attention(inputs["q"].float(), k.float(), v.float(),
                          TorchAttentionMetadata.build(meta, inputs["sliding_window"]), inputs["scale"])
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)


TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
Q_LENS = [1, 5, 17, 33]


@pytest.mark.parametrize("block_size, num_heads, num_kv_heads, head_dim, dtype", [
    (1, 2, 2, 32, torch.float32),      # GQA group 1, one token per block
    (4, 4, 2, 64, torch.float32),      # group 2
    (16, 4, 1, 32, torch.float32),     # group 4
    (5, 3, 1, 64, torch.float32),      # group 3, odd block size
    (7, 6, 2, 48, torch.float32),      # group 3, head_dim not a power of two
    (16, 4, 2, 64, torch.bfloat16),
    (5, 3, 1, 32, torch.bfloat16),
    (4, 5, 1, 32, torch.float32),      # group 5: each query's rows padded to 8, the padding masked
    (3, 32, 1, 16, torch.float32),     # group 32, more rows than the interpreter's tile: one query a tile
])
def test_chunks_match_reference(block_size, num_heads, num_kv_heads, head_dim, dtype):
    # earlier context: none, 3, exactly two blocks, an odd count that is not on a block boundary
    earlier = [0, 3, 2 * block_size, 21]
    inputs, meta, k, v, _ = make_case(Q_LENS, earlier, block_size, num_heads, num_kv_heads, head_dim, dtype)
    check(inputs, meta, k, v, **TOL[dtype])


@pytest.mark.parametrize("block_size, window, dtype", [
    (4, 8, torch.float32),      # window < q_len of the long chunks, a multiple of the block size
    (4, 13, torch.float32),     # not a multiple of the block size
    (5, 1, torch.float32),      # each query sees only itself
    (1, 20, torch.float32),     # window < earlier context
    (16, 40, torch.float32),    # window > q_len, < context
    (7, 12, torch.bfloat16),
])
def test_sliding_window_matches_reference_and_skips_freed_blocks(block_size, window, dtype):
    earlier = [0, 3, 4 * block_size, 45]
    inputs, meta, k, v, table = make_case(Q_LENS, earlier, block_size, 4, 2, 32, dtype, window=window, seed=1)
    if window < 45 - block_size:
        assert (table[3, 0] == -1).item()      # the trap is set: a block freed by the window
    check(inputs, meta, k, v, **TOL[dtype])


def test_decodes_only():
    # A batch of single-token "chunks" (decodes routed through this kernel), one with a window.
    earlier = [0, 6, 15, 40, 63]
    for window in (None, 9):
        inputs, meta, k, v, _ = make_case([1] * 5, earlier, 8, 4, 1, 32, torch.float32, window=window, seed=2)
        check(inputs, meta, k, v, **TOL[torch.float32])


def test_empty_chunk_in_batch():
    # A sequence with no new token this step gives no rows and must not disturb the others.
    inputs, meta, k, v, _ = make_case([4, 0, 9], [3, 5, 0], 4, 2, 1, 32, torch.float32, seed=3)
    out = paged_prefill_attention(**inputs)
    ref = paged_attention(inputs["q"], k, v, TorchAttentionMetadata.build(meta), inputs["scale"])
    torch.testing.assert_close(out, ref, **TOL[torch.float32])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("window", [None, 1024])
def test_realistic_shapes_on_gpu(window):
    # Mistral-7B attention: 32 query heads, 8 KV heads, head_dim 128, blocks of 16, bf16;
    # chunks of 512-2048 tokens after 0-2048 tokens of earlier context, plus one decode.
    q_lens, earlier = [512, 2048, 1000, 777, 1], [0, 2048, 1536, 333, 4000]
    inputs, meta, k, v, _ = make_case(q_lens, earlier, 16, 32, 8, 128, torch.bfloat16, window=window, seed=4)
    check(inputs, meta, k, v, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("tiles", [(64, 64, 4, 3), (64, 32, 4, 2), (32, 32, 4, 2), (128, 64, 8, 3)])
def test_gpu_tile_sizes_in_the_interpreter(monkeypatch, tiles):
    # The tiles a GPU uses (H200 16-bit, T4, fp32), larger than the interpreter's 16 x 16: query
    # tiles longer than some chunks, key tiles spanning several blocks and a window's start.
    monkeypatch.setattr(prefill_attention, "_tiles", lambda head_dim, dtype, device: tiles)
    inputs, meta, k, v, _ = make_case([1, 5, 70, 140], [0, 3, 32, 21], 16, 4, 2, 32, torch.float32, seed=4)
    check(inputs, meta, k, v, **TOL[torch.float32])
    inputs, meta, k, v, _ = make_case([1, 5, 70, 140], [0, 3, 80, 45], 5, 4, 2, 32, torch.float32, window=37, seed=5)
    check(inputs, meta, k, v, **TOL[torch.float32])


def test_a_padded_batch_gives_the_same_rows():
    # A CUDA graph replays the launch of a batch padded to T tokens and S sequences: the padding sequences are
    # empty (their cu_seqlens entries repeat the last one), the padding rows of q are never read (NaN here),
    # and the output's padding rows are never written.
    q_lens, earlier = [1, 6, 1, 19, 2], [4, 0, 30, 3, 9]
    inputs, meta, k, v, _ = make_case(q_lens, earlier, 4, 4, 2, 32, torch.float32, seed=5)
    out = paged_prefill_attention(**inputs)
    check(inputs, meta, k, v, **TOL[torch.float32])
    t, pad_rows, pad_seqs = sum(q_lens), 13, 6
    q = torch.cat([inputs["q"], torch.full((pad_rows, *inputs["q"].shape[1:]), float("nan"), device=DEVICE)])
    padded = dict(inputs, q=q,
                  cu_seqlens_q=torch.cat([inputs["cu_seqlens_q"], torch.full((pad_seqs,), t, dtype=torch.int32,
                                                                              device=DEVICE)]),
                  context_lens=torch.cat([inputs["context_lens"], torch.zeros(pad_seqs, dtype=torch.int32,
                                                                               device=DEVICE)]),
                  block_tables=torch.cat([inputs["block_tables"], torch.full(
                      (pad_seqs, inputs["block_tables"].shape[1]), -1, dtype=torch.int32, device=DEVICE)]),
                  out=torch.full_like(q, 7.0))
    got = paged_prefill_attention(**padded)
    assert torch.equal(got[:t], out) and (got[t:] == 7.0).all()


def test_one_query_sequences_can_be_left_to_the_decode_kernel():
    q_lens, earlier = [1, 9, 1, 3], [12, 2, 0, 5]
    inputs, meta, k, v, _ = make_case(q_lens, earlier, 4, 4, 1, 32, torch.float32, seed=6)
    full = paged_prefill_attention(**inputs)
    got = paged_prefill_attention(**inputs, out=torch.full_like(full, 7.0), min_query_len=2)
    ones = torch.tensor([0, 10], device=DEVICE)                     # the rows of the one-query sequences
    others = torch.tensor([i for i in range(sum(q_lens)) if i not in (0, 10)], device=DEVICE)
    assert (got[ones] == 7.0).all() and torch.equal(got[others], full[others])
