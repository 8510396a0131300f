"""The paged KV cache's bookkeeping: blocks, reference counts, block tables, prefix hashes.

A sequence's *block table* lists its blocks in order: token p lives in slot
`block_table[p // block_size] * block_size + p % block_size`, and blocks are taken as it grows.
Prefix caching names each full block by a hash chained over the prefix up to its end (the tokens are
compared too on a hit); a new request shares the cached blocks its prompt starts with. A block nobody
holds keeps its name and waits in an LRU list: it counts as free and is reused, least recently used
first, only when no never-used block is left. A sliding window releases blocks that left the window.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

NO_BLOCK = -1  # a released hole in a block table (sliding window)


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None          # set once the block is full and its prefix hash is known
    tokens: tuple[int, ...] = ()     # the block's token ids, to verify a hash hit


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: list[int] = list(range(num_blocks - 1, -1, -1))  # never used or holding nothing
        self.evictable: OrderedDict[int, None] = OrderedDict()          # ref 0, cached contents, LRU first
        self.cached: dict[int, int] = {}                                # prefix hash -> block id

    # ---- counts ------------------------------------------------------------------------
    @property
    def num_total_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    # ---- taking and giving back blocks -------------------------------------------------
    def _take_block(self) -> int:
        if self.free_ids:
            block_id = self.free_ids.pop()
        else:  # reuse the least recently used cached block: its prefix is forgotten
            block_id, _ = self.evictable.popitem(last=False)
            block = self.blocks[block_id]
            del self.cached[block.hash]
            block.hash, block.tokens = None, ()
        self.blocks[block_id].ref_count = 1
        return block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} released twice"
        if block.ref_count == 0:
            if block.hash is not None:
                self.evictable[block_id] = None  # most recently used at the end
            else:
                self.free_ids.append(block_id)

    def num_blocks_needed(self, seq, num_tokens: int) -> int:
        """New blocks `seq` needs so that its first `num_tokens` tokens have slots."""
        need = cdiv(num_tokens, self.block_size) - len(seq.block_table)
        return need if need > 0 else 0  # not max(0, need): this runs for every sequence at every step

    def can_allocate(self, seq, num_tokens: int) -> bool:
        return self.num_blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def allocate(self, seq, num_tokens: int) -> None:
        """Give `seq` slots for its first `num_tokens` tokens (the caller checked can_allocate)."""
        for _ in range(self.num_blocks_needed(seq, num_tokens)):
            seq.block_table.append(self._take_block())

    def free(self, seq) -> None:
        for block_id in reversed(seq.block_table):  # tail first: the LRU evicts a prefix's end first
            if block_id != NO_BLOCK:
                self._release(block_id)
        seq.block_table = []
        seq.num_cached_blocks = 0

    def free_tail(self, seq, num_tokens: int) -> bool:
        """Give back the blocks past the sequence's first `num_tokens` slots (rejected draft tokens).
        True if there were any."""
        keep = cdiv(num_tokens, self.block_size)
        freed = len(seq.block_table) > keep
        while len(seq.block_table) > keep:
            block_id = seq.block_table.pop()
            if block_id != NO_BLOCK:
                self._release(block_id)
        return freed

    def release_outside_window(self, seq, first_needed_position: int) -> None:
        """Sliding window: give back every block whose tokens all lie before `first_needed_position`."""
        for i in range(min(first_needed_position // self.block_size, len(seq.block_table))):
            if seq.block_table[i] != NO_BLOCK:
                self._release(seq.block_table[i])
                seq.block_table[i] = NO_BLOCK

    # ---- prefix caching ----------------------------------------------------------------
    def _hashes(self, seq, num_full_blocks: int) -> list[int]:
        """The prefix hashes of the sequence's first full blocks (computed once, kept on the sequence)."""
        hashes = seq.block_hashes
        while len(hashes) < num_full_blocks:
            tokens = self._block_tokens(seq, len(hashes))
            hashes.append(hash((hashes[-1] if hashes else None, tokens)))
        return hashes[:num_full_blocks]

    def _block_tokens(self, seq, i: int) -> tuple[int, ...]:
        return tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])

    def match_prefix(self, seq) -> int:
        """For a sequence with no blocks yet: share the cached blocks its tokens start with; returns the
        tokens whose KV is there. The last token is always computed: its logits sample the next one."""
        assert not seq.block_table
        if not self.enable_prefix_caching:
            return 0
        for i, block_hash in enumerate(self._hashes(seq, (len(seq) - 1) // self.block_size)):
            block_id = self.cached.get(block_hash)
            if block_id is None or self.blocks[block_id].tokens != self._block_tokens(seq, i):
                break
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.evictable[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        seq.num_cached_blocks = len(seq.block_table)
        return seq.num_cached_blocks * self.block_size

    def cache_full_blocks(self, seq) -> None:
        """Name the sequence's newly completed blocks so later requests can share them, once their tokens
        count as computed and their ids are on the host (`len(seq)` stops before a token in flight)."""
        num_full_blocks = min(seq.num_computed_tokens, len(seq)) // self.block_size
        if not self.enable_prefix_caching or num_full_blocks <= seq.num_cached_blocks:
            return  # the common case at a decode step: no block filled up
        hashes = self._hashes(seq, num_full_blocks)
        for i in range(seq.num_cached_blocks, len(hashes)):
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and hashes[i] not in self.cached:
                block.hash, block.tokens = hashes[i], self._block_tokens(seq, i)
                self.cached[hashes[i]] = block.block_id
        seq.num_cached_blocks = len(hashes)
