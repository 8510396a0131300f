"""The paged KV cache bookkeeping: unit cases and property-based tests (hypothesis)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.core.block_manager import NO_BLOCK, BlockManager
from minivllm.core.sequence import Sequence
from minivllm.sampling_params import SamplingParams


def seq_of(tokens, rid="r"):
    return Sequence(rid, list(tokens), SamplingParams())


def check_invariants(bm: BlockManager, seqs):
    """Every block is free, evictable, or referenced exactly as often as block tables hold it."""
    held = {}
    for s in seqs:
        for b in s.block_table:
            if b != NO_BLOCK:
                held[b] = held.get(b, 0) + 1
    for block in bm.blocks:
        assert block.ref_count == held.get(block.block_id, 0)
        in_free, in_lru = block.block_id in bm.free_ids, block.block_id in bm.evictable
        assert (block.ref_count == 0) == (in_free or in_lru) and not (in_free and in_lru)
        if block.hash is not None:
            assert bm.cached[block.hash] == block.block_id
    assert len(set(bm.free_ids)) == len(bm.free_ids)
    assert bm.num_free_blocks == sum(1 for b in bm.blocks if b.ref_count == 0)


def test_allocate_grows_one_block_at_a_time():
    bm = BlockManager(8, 4)
    s = seq_of(range(6))
    bm.allocate(s, 6)
    assert len(s.block_table) == 2 and bm.num_free_blocks == 6
    bm.allocate(s, 8)
    assert len(s.block_table) == 2
    bm.allocate(s, 9)
    assert len(s.block_table) == 3
    bm.free(s)
    assert bm.num_free_blocks == 8 and s.block_table == []


def test_prefix_hit_shares_blocks_and_keeps_the_last_token_uncached():
    bm = BlockManager(16, 4)
    a = seq_of(range(12), "a")
    bm.allocate(a, 12)
    a.num_computed_tokens = 12
    bm.cache_full_blocks(a)
    b = seq_of(list(range(8)) + [99, 98, 97, 96, 95], "b")
    assert bm.match_prefix(b) == 8 and b.block_table == a.block_table[:2]
    c = seq_of(range(12), "c")       # the same prompt: all of it cached, but its last token is recomputed
    assert bm.match_prefix(c) == 8
    check_invariants(bm, [a, b, c])
    for s in (a, b, c):
        bm.free(s)
    check_invariants(bm, [])
    assert bm.num_free_blocks == 16 and len(bm.evictable) == 3


def test_evicted_blocks_are_forgotten_and_collisions_are_verified():
    bm = BlockManager(2, 2)
    a = seq_of([1, 2, 3, 4, 5])
    bm.allocate(a, 4)
    a.num_computed_tokens = 4
    bm.cache_full_blocks(a)
    bm.free(a)
    assert len(bm.evictable) == 2
    other = seq_of([7, 7, 7])
    bm.allocate(other, 3)            # takes both blocks: the cached prefix is evicted
    assert not bm.cached and not bm.evictable
    bm.free(other)
    again = seq_of([1, 2, 3, 4, 5])
    assert bm.match_prefix(again) == 0


def test_hash_hit_with_different_tokens_is_rejected():
    bm = BlockManager(4, 2)
    a = seq_of([1, 2, 3])
    bm.allocate(a, 2)
    a.num_computed_tokens = 2
    bm.cache_full_blocks(a)
    b = seq_of([5, 6, 7])
    b.block_hashes = [a.block_hashes[0]]   # forge a collision
    assert bm.match_prefix(b) == 0


def test_sliding_window_release():
    bm = BlockManager(8, 4)
    s = seq_of(range(20))
    bm.allocate(s, 20)
    bm.release_outside_window(s, 9)      # tokens 0..8 no longer needed: blocks 0 and 1 go
    assert s.block_table[:2] == [NO_BLOCK, NO_BLOCK] and bm.num_free_blocks == 5
    bm.release_outside_window(s, 9)      # idempotent
    assert bm.num_free_blocks == 5
    bm.free(s)
    assert bm.num_free_blocks == 8


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_operations_keep_the_books_balanced(data):
    block_size = data.draw(st.integers(1, 4))
    bm = BlockManager(data.draw(st.integers(1, 12)), block_size)
    live = []
    vocab = st.integers(0, 3)  # a tiny vocabulary: prefixes are shared often
    for step in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["new", "grow", "free", "window"]))
        if op == "new":
            s = seq_of(data.draw(st.lists(vocab, min_size=1, max_size=12)), str(step))
            hit = bm.match_prefix(s)
            assert hit % block_size == 0 and hit < len(s)
            s.num_computed_tokens = hit
            if bm.can_allocate(s, len(s)):
                bm.allocate(s, len(s))
                s.num_computed_tokens = len(s)
                bm.cache_full_blocks(s)
                live.append(s)
            else:
                bm.free(s)
        elif op == "grow" and live:
            s = data.draw(st.sampled_from(live))
            s.token_ids.append(data.draw(vocab))
            if bm.can_allocate(s, len(s)):
                bm.allocate(s, len(s))
                s.num_computed_tokens = len(s)
                bm.cache_full_blocks(s)
            else:
                s.token_ids.pop()
        elif op == "free" and live:
            s = live.pop(data.draw(st.integers(0, len(live) - 1)))
            bm.free(s)
        elif op == "window" and live:
            s = data.draw(st.sampled_from(live))
            bm.release_outside_window(s, data.draw(st.integers(0, len(s))))
        check_invariants(bm, live)
    for s in live:
        bm.free(s)
    check_invariants(bm, [])
    assert bm.num_free_blocks == bm.num_total_blocks
