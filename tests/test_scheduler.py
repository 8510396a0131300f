"""The scheduler under random arrivals, lengths, aborts and pool sizes (hypothesis), without a model:
each step is simulated by marking the scheduled tokens computed and appending a token when a
sequence's prefill is complete."""
from hypothesis import given, settings, strategies as st

from minivllm.cache.block_manager import NO_BLOCK, BlockManager, cdiv
from minivllm.engine.scheduler import Scheduler
from minivllm.engine.sequence import Sequence, SequenceStatus
from minivllm.sampling_params import SamplingParams
from test_block_manager import check_invariants


def simulate_step(sched: Scheduler, max_tokens: dict, window=None):
    out = sched.schedule()
    assert sum(out.num_new_tokens) <= sched.max_num_batched_tokens
    assert len(out.seqs) == len(set(out.seqs)) <= sched.max_num_seqs
    for seq, n in zip(out.seqs, out.num_new_tokens):
        assert seq.status == SequenceStatus.RUNNING and 0 < n <= seq.num_uncomputed_tokens
        seq.num_computed_tokens += n
        live = [b for b in seq.block_table if b != NO_BLOCK]
        assert cdiv(seq.num_computed_tokens, sched.blocks.block_size) <= len(seq.block_table)
        if window is not None:  # memory stops growing at the window plus a chunk
            assert len(live) <= cdiv(window + n, sched.blocks.block_size) + 1
        sched.blocks.cache_full_blocks(seq)
    for seq in out.seqs:
        if seq.num_computed_tokens == len(seq):
            seq.token_ids.append(len(seq) % 7)
            if len(seq.output_token_ids) >= max_tokens[seq.request_id]:
                sched.finish(seq, "length")
    return out


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_every_request_finishes_and_nothing_leaks(data):
    block_size = data.draw(st.integers(1, 4))
    window = data.draw(st.one_of(st.none(), st.integers(2, 9)))
    chunked = data.draw(st.booleans())
    max_prompt, max_out = 12, 6
    budget = data.draw(st.integers(1, 16)) if chunked else data.draw(st.integers(max_prompt + max_out, 40))
    # The engine refuses requests that can never fit; here the pool fits the longest one.
    min_blocks = cdiv(max_prompt + max_out, block_size)
    bm = BlockManager(data.draw(st.integers(min_blocks, min_blocks + 10)), block_size,
                      enable_prefix_caching=window is None)
    sched = Scheduler(bm, data.draw(st.integers(1, 5)), budget, chunked, window,
                      continuous=data.draw(st.booleans()))
    max_tokens, everyone, aborted = {}, [], set()
    for step in range(400):
        if step < 30 and data.draw(st.booleans()):
            rid = str(step)
            seq = Sequence(rid, data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=max_prompt)),
                           SamplingParams())
            max_tokens[rid] = data.draw(st.integers(1, max_out))
            everyone.append(seq)
            sched.add(seq)
        if everyone and data.draw(st.integers(0, 9)) == 0:
            victim = data.draw(st.sampled_from(everyone))
            if not victim.is_finished:
                sched.finish(victim, "abort")
                aborted.add(victim.request_id)
        simulate_step(sched, max_tokens, window)
        check_invariants(bm, sched.running)
        assert all(not s.block_table for s in sched.waiting)
        if step >= 30 and not sched.num_unfinished:
            break
    assert sched.num_unfinished == 0, "a request never finished"
    for seq in everyone:
        assert seq.is_finished
        if seq.request_id not in aborted:
            assert len(seq.output_token_ids) == max_tokens[seq.request_id]
    assert bm.num_free_blocks == bm.num_total_blocks


def test_decodes_go_first_and_long_prompts_are_chunked():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=10)
    short = Sequence("short", [1, 2, 3], SamplingParams())
    sched.add(short)
    simulate_step(sched, {"short": 50})
    long = Sequence("long", list(range(30)), SamplingParams())
    sched.add(long)
    for _ in range(3):
        out = simulate_step(sched, {"short": 50, "long": 5})
        assert out.seqs[0] is short and out.num_new_tokens[0] == 1     # the decode never waits
        assert out.num_new_tokens[1] == 9                               # the prompt fills the rest
    assert long.num_computed_tokens == 27


def test_preemption_frees_the_newest_and_requeues_it_first():
    bm = BlockManager(4, 2)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    a, b = Sequence("a", [1, 2, 3], SamplingParams()), Sequence("b", [4, 5, 6], SamplingParams())
    sched.add(a), sched.add(b)
    simulate_step(sched, {"a": 9, "b": 9})            # both prefilled: 2 blocks each, pool full
    assert bm.num_free_blocks == 0
    simulate_step(sched, {"a": 9, "b": 9})            # tokens 4: still inside the blocks
    out = simulate_step(sched, {"a": 9, "b": 9})      # token 5 needs a block: b goes
    assert sched.num_preemptions == 1 and out.seqs == [a] and sched.waiting[0] is b
    assert b.num_computed_tokens == 0 and b.block_table == []
