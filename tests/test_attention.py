"""The reference paged attention against attention written out per sequence, on random caches:
mixed decodes and prefill chunks, GQA, sliding windows, odd block sizes, shuffled blocks."""
import pytest
import torch

from minivllm.attention import AttentionMetadata
from minivllm.attention.torch_ref import TorchAttentionMetadata, paged_attention


def attention_one_sequence(q, k, v, scale, window):
    """q [n, Hq, D] are the last n of the L tokens whose keys/values are k, v [L, Hkv, D]."""
    n, L = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    q_pos = torch.arange(L - n, L)[:, None]
    k_pos = torch.arange(L)[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@pytest.mark.parametrize("block_size,window,heads,kv_heads", [(1, None, 4, 4), (3, None, 6, 2), (16, 5, 4, 1),
                                                             (4, 9, 8, 2)])
def test_paged_attention_matches_per_sequence_attention(block_size, window, heads, kv_heads):
    g = torch.Generator().manual_seed(block_size * 100 + heads)
    D, num_blocks = 8, 64
    k_cache = torch.randn(num_blocks, block_size, kv_heads, D, generator=g)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, D, generator=g)
    # decodes first (one new token), then prefill chunks: (new tokens, context length)
    shapes = [(1, 1), (1, 7), (1, 2 * block_size), (5, 5), (3, 11), (1, 9)]
    free = torch.randperm(num_blocks, generator=g).tolist()
    tables = [[free.pop() for _ in range(-(-ctx // block_size))] for _, ctx in shapes]
    width = max(map(len, tables))
    q_lens = [n for n, _ in shapes]
    q = torch.randn(sum(q_lens), heads, D, generator=g)
    meta = AttentionMetadata(
        cu_seqlens_q=torch.tensor([0] + q_lens).cumsum(0).int(),
        context_lens=torch.tensor([c for _, c in shapes]).int(),
        slot_mapping=torch.zeros(sum(q_lens), dtype=torch.long),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]).int(), block_size=block_size,
        max_query_len=max(q_lens), max_context_len=max(c for _, c in shapes),
        num_decodes=3, max_decode_context_len=max(c for _, c in shapes[:3]))
    out = paged_attention(q, k_cache, v_cache, TorchAttentionMetadata.build(meta, window), D ** -0.5)
    start = 0
    for (n, ctx), table in zip(shapes, tables):
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(ctx)])
        k = k_cache.view(-1, kv_heads, D)[slots]
        v = v_cache.view(-1, kv_heads, D)[slots]
        ref = attention_one_sequence(q[start:start + n], k, v, D ** -0.5, window)
        torch.testing.assert_close(out[start:start + n], ref, rtol=1e-5, atol=1e-5)
        start += n
