"""A rotating KV cache for sliding-window attention: W slots per sequence, reused forever.

What: the cache of Mistral's reference implementation (mistral-src, `RotatingBufferCache`). A
model whose attention sees only the last W tokens (a sliding window) never reads an older key
again, so each sequence gets exactly W slots, and the token at position p goes to slot p mod W,
overwriting the token at p - W, the one that has just left the window:

    position  0 1 2 3 4 5 6 7 8 9 ...        (W = 4)
    slot      0 1 2 3 0 1 2 3 0 1 ...        slot 1 holds position 9 once 9 is written, 5 before it

Why: the memory of a sequence is fixed at W tokens from its first step to its last: nothing is
ever allocated or freed while it runs, and no block table is needed. The paged engine
(`block_manager.BlockManager.release_outside_window`) gets the same bound differently: it frees
whole blocks once all their tokens have left the window, so a sequence holds the window plus at
most one partly dead block, in blocks from a pool that every sequence shares (which is what prefix
caching and preemption work with). Notebook 07 compares the two.

For attention, `in_window_order()` returns the keys and values in window order (oldest first) with a mask of
the slots written so far. A decode query (the newest token of each sequence) attends to exactly
these keys: `window_attention` does it, and tests/test_rotating_cache.py checks it against full
attention with a sliding-window mask.

    >>> cache = RotatingKVCache(window=4, num_kv_heads=2, head_dim=8)             # one sequence
    >>> for p in range(10):
    ...     k, v, q = torch.randn(1, 2, 8), torch.randn(1, 2, 8), torch.randn(4, 8)
    ...     cache.write(k, v, torch.tensor([p]))                                  # slot p % 4
    ...     out = window_attention(q[None], cache)[0]                             # sees positions p-3..p
    >>> cache.positions.tolist()
    [[8, 9, 6, 7]]

Torch only, no kernels: it is here to be read. A batch is B sequences of one window each
(`batch_size=B`; inputs [B, T, H, D], positions [B, T], where a negative position is padding).
"""
from __future__ import annotations

import torch


class RotatingKVCache:
    """Keys and values of the last `window` tokens of `batch_size` sequences, slot = position % window."""

    def __init__(self, window: int, num_kv_heads: int, head_dim: int, batch_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.window = window
        shape = (batch_size, window, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # The position held by each slot; -1: never written. Only needed to order and mask the slots.
        self.positions = torch.full((batch_size, window), -1, dtype=torch.long, device=device)

    @property
    def batch_size(self) -> int:
        return self.k.shape[0]

    def nbytes(self) -> int:
        """Bytes of keys and values, the same from the first token to the millionth."""
        return self.k.nbytes + self.v.nbytes

    def write(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        """Store new tokens: k, v [B, T, Hkv, D] and positions [B, T], increasing along T (or, for
        one sequence, [T, Hkv, D] and [T]). A negative position is padding and is skipped. Token p
        goes to slot p % window; of a chunk longer than the window only its last `window` tokens
        are kept (the earlier ones would be overwritten by the later ones anyway)."""
        if positions.dim() == 1:
            k, v, positions = k[None], v[None], positions[None]
        for b in range(positions.shape[0]):
            keep = positions[b] >= 0
            pos = positions[b][keep][-self.window:]
            slots = pos % self.window               # all different: at most `window` consecutive positions
            self.k[b, slots] = k[b][keep][-self.window:].to(self.k.dtype)
            self.v[b, slots] = v[b][keep][-self.window:].to(self.v.dtype)
            self.positions[b, slots] = pos

    def window_order(self) -> torch.Tensor:
        """[B, window] slot indices, oldest position first: the slot after the newest one is the oldest."""
        newest_slot = self.positions.argmax(dim=1)  # the highest position written
        offsets = torch.arange(1, self.window + 1, device=self.positions.device)
        return (newest_slot[:, None] + offsets[None, :]) % self.window

    def in_window_order(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(k, v, positions, valid) in window order: k, v [B, window, Hkv, D], positions [B, window],
        valid [B, window] False for slots not written yet (a sequence shorter than the window)."""
        order = self.window_order()
        index = order[:, :, None, None].expand(-1, -1, *self.k.shape[2:])
        positions = self.positions.gather(1, order)
        return self.k.gather(1, index), self.v.gather(1, index), positions, positions >= 0


def window_attention(q: torch.Tensor, cache: RotatingKVCache, scale: float | None = None) -> torch.Tensor:
    """Decode attention over the rotating cache: q [B, Hq, D], the query of each sequence's newest
    token (already written), -> [B, Hq, D]. Grouped-query attention: Hq may be a multiple of Hkv."""
    k, v, _, valid = cache.in_window_order()
    group = q.shape[1] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)   # [B, W, Hq, D]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    acc = torch.promote_types(q.dtype, torch.float32)  # the softmax in fp32 at least, as the kernels do
    scores = torch.einsum("bhd,bwhd->bhw", q.to(acc), k.to(acc)) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))   # slots not written yet
    return torch.einsum("bhw,bwhd->bhd", scores.softmax(dim=-1), v.to(acc)).to(q.dtype)
