"""What a flat batch tells attention: which tokens belong to which sequence, and their cache slots.
Sequence a prefills 3 tokens, b decodes its 6th: cu_seqlens_q [0, 3, 4], context_lens [3, 6],
positions [0 1 2 5], slot_mapping [a0 a1 a2 b5] (slot = block * block_size + offset).
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
    # The first `num_decodes` sequences are decodes, one token each.
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
    """Metadata for a forward without a KV cache: each sequence attends over its new tokens only."""
    cu_seqlens_q: torch.Tensor      # [num_seqs + 1] int32
    max_query_len: int
    # The padded [B, L] layout, built once for all layers.
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
