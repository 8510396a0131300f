"""The Triton backend's attention (store, then the decode and prefill kernels into one output) against the
torch reference backend, on a step that mixes decodes, prompt chunks and a one-token chunk, and on the same step
padded as a CUDA graph pads it (more rows, empty sequences, slots of -1). Fresh random inputs each run (the seed
is in the failure message); Triton's interpreter on a CPU.
"""
from __future__ import annotations

import random

import pytest
import torch

from minivllm.attention import AttentionMetadata, torch_ref
from minivllm.attention.triton_backend import paged_attention

HQ, HKV, D, BLOCK_SIZE, NUM_BLOCKS = 4, 2, 32, 4, 40
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def step(q_lens, context_lens, tables, pad_tokens=0, pad_seqs=0):
    """Metadata of a step whose sequence i computes its last q_lens[i] of context_lens[i] tokens, padded with
    `pad_tokens` rows and `pad_seqs` empty sequences."""
    slots = [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
             for n, ctx, table in zip(q_lens, context_lens, tables) for p in range(ctx - n, ctx)]
    width = max(map(len, tables))
    rows = [t + [0] * (width - len(t)) for t in tables] + [[0] * width] * pad_seqs
    num_decodes = next((i for i, n in enumerate(q_lens) if n != 1), len(q_lens))
    return AttentionMetadata(
        cu_seqlens_q=torch.tensor([0, *q_lens, *[0] * pad_seqs]).cumsum(0).int(),  # empty padding sequences
        context_lens=torch.tensor([*context_lens, *[0] * pad_seqs]).int(),
        slot_mapping=torch.tensor(slots + [-1] * pad_tokens), block_tables=torch.tensor(rows).int(),
        block_size=BLOCK_SIZE, max_query_len=max(q_lens), max_context_len=max(context_lens), num_decodes=num_decodes,
        max_decode_context_len=max(context_lens[:num_decodes], default=0))


def to_device(meta: AttentionMetadata) -> AttentionMetadata:
    for name in ("cu_seqlens_q", "context_lens", "slot_mapping", "block_tables"):
        setattr(meta, name, getattr(meta, name).to(DEVICE))
    return meta


@pytest.mark.parametrize("window", [None, 6])
def test_a_mixed_step_matches_the_torch_backend_padded_or_not(window):
    seed = random.randrange(2 ** 32)
    g = torch.Generator().manual_seed(seed)
    # decodes first, then prompt chunks; the last chunk is one token long (a prompt's last token)
    q_lens, earlier = [1, 1, 7, 3, 1], [5, 12, 0, 9, 6]
    context_lens = [e + n for e, n in zip(earlier, q_lens)]
    free = torch.randperm(NUM_BLOCKS, generator=g).tolist()
    tables = [[free.pop() for _ in range(-(-c // BLOCK_SIZE))] for c in context_lens]
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, HKV, D, generator=g)  # the earlier tokens' keys and values
    t, pad = sum(q_lens), 6
    q, k, v = (torch.randn(t + pad, h, D, generator=g) for h in (HQ, HKV, HKV))

    cache, q, k, v = (x.to(DEVICE) for x in (cache, q, k, v))
    ref_cache = cache.clone()
    meta = to_device(step(q_lens, context_lens, tables))
    torch_ref.store_kv(k[:t], v[:t], *ref_cache, meta.slot_mapping)
    ref = torch_ref.paged_attention(q[:t], *ref_cache, torch_ref.TorchAttentionMetadata.build(meta, window), D ** -0.5)

    outs = []
    for pad_tokens, pad_seqs in ((0, 0), (pad, 3)):
        kv = cache.clone()
        n = t + pad_tokens
        out = paged_attention(q[:n], k[:n], v[:n], *kv,
                              to_device(step(q_lens, context_lens, tables, pad_tokens, pad_seqs)), D ** -0.5, window)
        assert out.shape == (n, HQ, D)
        torch.testing.assert_close(out[:t], ref, atol=2e-5, rtol=2e-5, msg=lambda m: f"{seed=}: {m}")
        assert torch.equal(kv, ref_cache), f"{seed=}: the caches differ (padding tokens must store nothing)"
        outs.append(out[:t])
    assert torch.equal(*outs), f"{seed=}: padding changed a real row"
