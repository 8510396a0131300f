"""The attention metadata that travels with every flat batch.

The model never sees "a batch of sequences": it sees one flat run of tokens, with each
token's position, and this record that says which tokens belong to which sequence and
where their keys and values live in the KV cache. Prefill and decode are the same thing
here: a decode is a sequence that contributes one new token.

Example: two sequences, one prefilling 3 tokens and one decoding its 6th token::

    input_ids      [a0 a1 a2 b5]
    positions      [ 0  1  2  5]
    cu_seqlens_q   [0, 3, 4]          sequence i owns tokens cu_seqlens_q[i]:cu_seqlens_q[i+1]
    context_lens   [3, 6]             keys each sequence attends to, new tokens included
    slot_mapping   [s0 s1 s2 s5]      flat cache slot where each new token's K/V is written
    block_tables   [[blk..], [blk..]] cache blocks of each sequence, in order

The KV cache of every layer is `[num_blocks, block_size, num_kv_heads, head_dim]`; slot
`s` is block `s // block_size`, offset `s % block_size`. A contiguous cache is the special
case of one block per sequence with `block_size = max_model_len`.

The model runner builds this record once per step, then the attention backend adds what its own
kernels need (`torch_ref.TorchAttentionMetadata`, `triton_backend.TritonAttentionMetadata`), once
per step too, in one place (`AttentionBackend.build_metadata`): every layer then reads the same record.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    cu_seqlens_q: torch.Tensor      # [num_seqs + 1] int32
    context_lens: torch.Tensor      # [num_seqs] int32
    slot_mapping: torch.Tensor      # [num_tokens] int64
    block_tables: torch.Tensor      # [num_seqs, max_blocks] int32
    block_size: int
    max_query_len: int
    max_context_len: int
    # The scheduler says which entries are decodes and puts them first: the first `num_decodes`
    # sequences bring one token each. Attention treats them apart, so a decode is never padded
    # to the length of a prefill chunk.
    num_decodes: int = 0
    max_decode_context_len: int = 0

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]


@dataclass
class NoCacheMetadata:
    """Metadata for a forward without a KV cache: each sequence attends over its own new
    tokens only (the "recompute everything" baseline and the logits checks)."""
    cu_seqlens_q: torch.Tensor      # [num_seqs + 1] int32
    max_query_len: int
    # The padded layout, the same for every layer, so built once here: `padded_index` [B, L] is the
    # flat index of each sequence's i-th token, `valid` [B, L] whether it exists, `unpad` where the
    # real tokens sit in the flattened padded layout, `lens` [B] the lengths.
    padded_index: torch.Tensor = field(init=False, repr=False)
    valid: torch.Tensor = field(init=False, repr=False)
    unpad: torch.Tensor = field(init=False, repr=False)
    lens: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self):
        cu = self.cu_seqlens_q
        self.lens = cu[1:] - cu[:-1]
        i = torch.arange(self.max_query_len, device=cu.device)
        self.valid = i[None, :] < self.lens[:, None]
        self.padded_index = torch.where(self.valid, cu[:-1, None] + i[None, :], 0).long()
        self.unpad = self.valid.flatten().nonzero().squeeze(1)
