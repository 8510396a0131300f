"""The scheduler and the engine's step loop under random arrivals, lengths, stops, aborts and pool sizes
(hypothesis), with async scheduling on and off, without a model.

A fake model runner stands in for the GPU: the k-th output token of a request is fixed in advance
(`true_token`), so whatever the schedule, every request must end with exactly its true tokens: up to
its stop token or `max_tokens`, or a prefix of them if it was aborted. With async scheduling, requests
finish, are aborted and are preempted while the next step is already in flight.
"""
import os
import random
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_block_manager import check_invariants

from minivllm.core.async_scheduler import AsyncScheduler
from minivllm.core.block_manager import NO_BLOCK, BlockManager, cdiv
from minivllm.core.scheduler import Scheduler
from minivllm.core.sequence import Sequence, SequenceStatus
from minivllm.engine.core import EngineCore
from minivllm.engine.input_processor import InputProcessor
from minivllm.sampling_params import SamplingParams

STOP = 3


def true_token(request_id: str, k: int) -> int:
    """The token a deterministic model samples as request `request_id`'s k-th output."""
    return (sum(map(ord, request_id)) * 7 + k * k) % 5


class FakeExecutor:
    """The executor's interface (`minivllm.executor.Executor`). It checks each step as the GPU would need it,
    and "samples" true tokens."""

    def __init__(self, scheduler: Scheduler, window=None):
        self.scheduler, self.window = scheduler, window
        self.last_sampled_rows: dict[str, int] = {}
        self.rows: set[str] = set()  # the requests that hold a block-table row, as the real runner keeps them
        self.num_steps = 0

    def execute_model(self, out):
        sched, bs = self.scheduler, self.scheduler.blocks.block_size
        assert 0 < sum(out.num_new_tokens) <= sched.max_num_batched_tokens    # the token budget holds
        assert len(out.seqs) == len(set(out.seqs)) <= sched.max_num_seqs
        assert all(e.num_tokens == 1 and e.samples for e in out.decodes)
        self.rows -= set(out.released_request_ids)
        self.rows |= {seq.request_id for seq in out.seqs}
        assert len(self.rows) <= sched.max_num_seqs, "released sequences never reached the runner"
        for e in out.entries:
            seq = e.seq
            assert seq.status == SequenceStatus.RUNNING and e.num_tokens > 0
            assert cdiv(e.start + e.num_tokens, bs) <= len(seq.block_table)   # every new token has a slot
            assert all(b != NO_BLOCK for b in seq.block_table[e.start // bs:])
            if self.window is not None:  # memory stops growing at the window plus a chunk
                live = [b for b in seq.block_table if b != NO_BLOCK]
                assert len(live) <= cdiv(self.window + e.num_tokens, bs) + 1
            known = seq.token_ids[e.start:e.start + e.num_tokens]
            if len(known) < e.num_tokens:  # its input token is still on the "GPU": the last step sampled it
                assert e.num_tokens == 1 and seq.request_id in self.last_sampled_rows
            # A sampling entry reaches its last token (with async scheduling its sample is already a placeholder).
            end = e.start + e.num_tokens
            assert end == seq.num_tokens - isinstance(sched, AsyncScheduler) if e.samples else end < seq.num_tokens
        self.num_steps += 1
        return [true_token(e.seq.request_id, e.start + e.num_tokens - e.seq.num_prompt_tokens)
                for e in out.entries if e.samples]

    def propose(self, out):
        return None  # no speculative decoding here

    def sample(self, tokens, out, draft_probs=None, grammar_bitmask=None):
        self.last_sampled_rows = {seq.request_id: i for i, seq in enumerate(out.sampled_seqs)}
        return SimpleNamespace(tolist=lambda: tokens, logprobs=lambda: None)


def fake_engine(scheduler: Scheduler, async_scheduling: bool, window=None) -> EngineCore:
    """The real EngineCore step loop around the real scheduler, with the fake executor."""
    assert async_scheduling == isinstance(scheduler, AsyncScheduler)
    config = SimpleNamespace(async_scheduling=async_scheduling, device="cpu")
    inputs = InputProcessor(None, 1000, scheduler.max_model_len, scheduler.blocks.block_size,
                            scheduler.blocks.num_total_blocks, scheduler.max_num_batched_tokens, window)
    return EngineCore(config, scheduler, FakeExecutor(scheduler, window), inputs)


def expected_tokens(seq: Sequence, max_model_len: int) -> list[int]:
    tokens = []
    while len(tokens) < seq.params.max_tokens and seq.num_prompt_tokens + len(tokens) < max_model_len:
        tokens.append(true_token(seq.request_id, len(tokens)))
        if tokens[-1] in seq.params.stop_token_ids:
            break
    return tokens


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_every_request_gets_exactly_its_tokens_and_nothing_leaks(data):
    block_size = data.draw(st.integers(1, 4))
    window = data.draw(st.one_of(st.none(), st.integers(2, 9)))
    chunked = data.draw(st.booleans())
    max_prompt, max_out, max_model_len = 12, 6, 16
    budget = data.draw(st.integers(1, 16)) if chunked else data.draw(st.integers(max_model_len, 40))
    # The engine refuses requests that can never fit; here the pool fits the longest one.
    min_blocks = cdiv(max_model_len, block_size) + 1
    bm = BlockManager(data.draw(st.integers(min_blocks, min_blocks + 10)), block_size,
                      enable_prefix_caching=window is None)
    overlap = data.draw(st.booleans())
    sched = (AsyncScheduler if overlap else Scheduler)(
        bm, data.draw(st.integers(1, 5)), budget, max_model_len, enable_chunked_prefill=chunked,
        sliding_window=window, continuous=data.draw(st.booleans()))
    engine = fake_engine(sched, async_scheduling=overlap, window=window)
    everyone, aborted, outputs = [], set(), {}
    for step in range(400):
        if step < 30 and data.draw(st.booleans()):
            params = SamplingParams(max_tokens=data.draw(st.integers(1, max_out)),
                                    stop_token_ids=[STOP] if data.draw(st.booleans()) else None)
            # Prompts drawn from a few ids, so that prefixes repeat and the prefix cache has hits.
            seq = Sequence(str(step), data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=max_prompt)), params)
            everyone.append(seq)
            sched.add(seq)
        if everyone and data.draw(st.integers(0, 9)) == 0:   # an abort, possibly of a request in a step in flight
            victim = data.draw(st.sampled_from(everyone))
            if engine.abort_requests([victim.request_id]):
                aborted.add(victim.request_id)
        for out in engine.step():
            assert out.request_id not in outputs  # nothing after the end
            if out.finish_reason is not None:
                outputs[out.request_id] = out
        check_invariants(bm, sched.running)
        assert all(not s.block_table for s in sched.waiting)
        assert len(sched.running) <= sched.max_num_seqs
        if step >= 30 and not engine.has_unfinished_requests():
            break
    assert not engine.has_unfinished_requests(), "a request never finished"
    for seq in everyone:
        assert seq.is_finished and seq.num_output_placeholders == 0
        want = expected_tokens(seq, max_model_len)
        if seq.request_id in aborted:
            assert seq.output_token_ids == want[:len(seq.output_token_ids)]
        else:
            assert seq.output_token_ids == want and seq.request_id in outputs
            assert seq.finish_reason == ("stop" if want[-1] in seq.params.stop_token_ids else "length")
    assert bm.num_free_blocks == bm.num_total_blocks


def test_a_request_that_stops_wastes_at_most_the_step_in_flight():
    # b's second token is its stop token; with async scheduling b is already in the next step when
    # that token reaches the host: that step's token for b is dropped, and b's blocks come back.
    bm = BlockManager(16, 4)
    sched = AsyncScheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    engine = fake_engine(sched, async_scheduling=True)
    stop_at = true_token("b", 1)
    b = Sequence("b", [1, 2, 3], SamplingParams(max_tokens=10, stop_token_ids=[stop_at]))
    sched.add(b)
    while engine.has_unfinished_requests():
        engine.step()
    assert b.output_token_ids == [true_token("b", 0), stop_at] and b.finish_reason == "stop"
    assert engine.executor.num_steps == 3  # prefill, the stop token, one step wasted
    assert bm.num_free_blocks == bm.num_total_blocks


def test_a_request_at_its_length_limit_is_not_scheduled_again():
    # The token in flight is surely the last (max_tokens): no step is wasted on it.
    bm = BlockManager(16, 4)
    sched = AsyncScheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    engine = fake_engine(sched, async_scheduling=True)
    sched.add(Sequence("a", [1, 2, 3], SamplingParams(max_tokens=3)))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.executor.num_steps == 3


def test_decodes_go_first_and_long_prompts_are_chunked():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=10, max_model_len=64)
    engine = fake_engine(sched, async_scheduling=False)
    short = Sequence("short", [1, 2, 3], SamplingParams(max_tokens=50))
    sched.add(short)
    engine.step()
    long = Sequence("long", list(range(30)), SamplingParams(max_tokens=5))
    sched.add(long)
    for _ in range(3):
        out = sched.schedule()
        assert out.decodes[0].seq is short and out.num_decodes == 1     # the decode never waits
        assert out.prefills[0].seq is long and out.prefills[0].num_tokens == 9   # the prompt fills the rest
        engine._update((out, engine.executor.sample(engine.executor.execute_model(out), out)))
    assert long.num_computed_tokens == 27


def test_preemption_frees_the_newest_and_requeues_it_first():
    bm = BlockManager(4, 2)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    engine = fake_engine(sched, async_scheduling=False)
    a = Sequence("a", [1, 2, 3], SamplingParams(max_tokens=9))
    b = Sequence("b", [4, 5, 6], SamplingParams(max_tokens=9))
    sched.add(a), sched.add(b)
    engine.step()                                     # both prefilled: 2 blocks each, pool full
    assert bm.num_free_blocks == 0
    engine.step()                                     # tokens 4: still inside the blocks
    out = sched.schedule()                            # token 5 needs a block: b goes
    assert sched.num_preemptions == 1 and out.seqs == [a] and sched.waiting[0] is b
    assert b.num_computed_tokens == 0 and b.block_table == [] and out.released_request_ids == ["b"]


def test_a_thousand_sequences_are_admitted_in_order_and_nobody_waits_while_there_is_room():
    # Serving at the device-sized default (1024 sequences, 8192 tokens a step), requests arriving every step as in
    # W3 (a shared 128-token system prompt, user parts of 16-256 tokens, answers of 20-150): admission is first
    # come, first served, and a request waits only while the step is full (slots, token budget or KV blocks).
    g = random.Random(int.from_bytes(os.urandom(4)))
    bm = BlockManager(30000, 16, enable_prefix_caching=True)
    sched = AsyncScheduler(bm, max_num_seqs=1024, max_num_batched_tokens=8192, max_model_len=1024)
    engine = fake_engine(sched, async_scheduling=True)
    system = [g.randrange(1000) for _ in range(128)]
    arrival, admitted, seen, schedule = {}, [], set(), sched.schedule

    def checked_schedule():
        out = schedule()
        admitted.extend(s.request_id for s in sched.running if s.request_id not in seen)
        seen.update(admitted)
        if sched.waiting:
            head = sched.waiting[0]
            full = (len(sched.running) == sched.max_num_seqs or sum(out.num_new_tokens) == sched.max_num_batched_tokens
                    or bm.num_free_blocks == 0 or not sched._may_admit(head))
            assert full, f"{head.request_id} waits with room in the step"
        return out

    sched.schedule = checked_schedule
    most_running = 0
    for step in range(160):
        for _ in range(g.randrange(40) if step < 100 else 0):
            rid = f"r{len(arrival)}"
            arrival[rid] = len(arrival)
            prompt = system + [g.randrange(1000) for _ in range(g.randrange(16, 257))]
            sched.add(Sequence(rid, prompt, SamplingParams(max_tokens=g.randrange(20, 151))))
        engine.step()
        most_running = max(most_running, len(sched.running))
    while engine.has_unfinished_requests():
        engine.step()
    assert [arrival[r] for r in admitted] == sorted(arrival[r] for r in admitted) and len(admitted) == len(arrival)
    assert most_running > 256
    assert bm.num_free_blocks == bm.num_total_blocks
