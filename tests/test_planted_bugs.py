"""Tests that catch one-line bugs the rest of the suite misses: preemption order, a token in flight,
prefix-cache eviction order, and aborts that must reach the engine core (AsyncLLM).

Each test's docstring names the bug it catches. They go through public interfaces (LLM, LLMEngine,
AsyncLLM, BlockManager) so that they survive a rewrite of the engine's internals.
"""
import asyncio

import pytest
from test_block_manager import seq_of
from test_engine import hf_greedy, random_prompts

from conftest import make_checkpoint
from minivllm import LLM, AsyncLLM, SamplingParams
from minivllm.core.block_manager import BlockManager

# ---- scheduler: preemption -----------------------------------------------------------------------

def test_a_preempted_request_is_readmitted_before_the_queue(tiny_llama):
    """Planted bug: `Scheduler._preempt` requeues the preempted request at the back of the waiting queue
    (`self.waiting.append(seq)` instead of `appendleft`), so requests that arrived after it overtake it.

    Two requests run (max_num_seqs=2), two wait. The pool (6 blocks of 4) holds both running requests'
    prompts and first tokens, but not their last ones: b, the newer, is preempted. It must be the next
    request admitted, ahead of c and d: no step may give c or d a token while b waits unfinished. With the
    bug, c is admitted while b waits (and the requests then preempt each other over and over)."""
    llm = LLM(tiny_llama[0], max_model_len=64, block_size=4, num_kv_blocks=6, max_num_seqs=2)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for rid, prompt in zip("abcd", random_prompts(4, seed=3, low=8, high=9)):  # 8 tokens each, no shared prefix
        engine.add_request(rid, prompt, params)
    b_done, steps = False, []
    for _ in range(200):
        outs = {out.request_id: out for out in engine.step()}
        steps.append({rid: len(out.outputs[0].token_ids) for rid, out in outs.items()})
        if not b_done and ("c" in outs or "d" in outs):
            assert "b" in set(outs), f"c or d got a token while the preempted b waited: {steps}"
        b_done = b_done or ("b" in outs and outs["b"].finished)
        if not engine.has_unfinished_requests():
            break
    assert engine.get_stats()["num_preemptions"] >= 1
    assert all(n == 8 for n in steps[-1].values()) and sum("c" in s or "d" in s for s in steps) > 0


def test_a_request_preempted_with_a_token_in_flight_waits_for_it(tiny_llama):
    """Planted bug: the admission guard `if self.waiting[0].num_output_placeholders: break` removed from
    `Scheduler.schedule`. With async scheduling, a request preempted while its last sampled token is still
    in flight would then be readmitted in the same step, and its recomputed prompt would end with a token
    the host does not know yet.

    Two identical prompts, greedy: b computes the same blocks as a, so its own copies are not named in the
    prefix cache. A 6-block pool runs dry, b is preempted, and its recompute would find a's blocks in the
    cache and fit at once: without the guard, its prefill reaches the token in flight (the model runner
    raises). With it, both requests get transformers' greedy tokens."""
    folder, hf = tiny_llama
    prompt = [5, 6, 7, 8, 9]
    want = hf_greedy(hf, prompt, 16)
    for overlap in (True, False):
        llm = LLM(folder, max_model_len=64, block_size=4, num_kv_blocks=6, max_num_seqs=4,
                  async_scheduling=overlap)
        outs = llm.generate([prompt, prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                            use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == [want, want]
        stats = llm.llm_engine.get_stats()
        assert stats["num_preemptions"] >= 1
        assert stats["num_free_blocks"] == stats["num_total_blocks"]


# ---- block manager: which free block is reused -----------------------------------------------------

def _cache(bm: BlockManager, tokens, rid):
    """A request that computed `tokens` (whole blocks), named them in the prefix cache and finished."""
    s = seq_of(tokens, rid)
    bm.allocate(s, len(tokens))
    s.num_computed_tokens = len(tokens)
    bm.cache_full_blocks(s)
    bm.free(s)


def _hit(bm: BlockManager, tokens) -> int:
    """Tokens of `tokens` + one more that a new request finds in the prefix cache (its blocks are given back)."""
    s = seq_of(list(tokens) + [99], "probe")
    n = bm.match_prefix(s)
    bm.free(s)
    return n


def test_never_used_blocks_are_taken_before_cached_ones():
    """Planted bug: `BlockManager._take_block` reuses a cached-but-free block (the LRU list) while never-used
    blocks are still free (e.g. `if self.free_ids and not self.evictable:`), which forgets cached prefixes
    for nothing.

    A 4-block pool: one request leaves 2 cached blocks; a new request takes 2 blocks; the cached prefix must
    still be found whole."""
    bm = BlockManager(num_blocks=4, block_size=2)
    _cache(bm, [1, 2, 3, 4], "a")
    other = seq_of([7, 7, 7, 7], "b")
    bm.allocate(other, 4)
    assert _hit(bm, [1, 2, 3, 4]) == 4
    bm.free(other)
    assert bm.num_free_blocks == bm.num_total_blocks


def test_cached_blocks_are_evicted_least_recently_used_first():
    """Planted bug: `BlockManager._take_block` evicts the most recently used cached block
    (`self.evictable.popitem(last=True)`) instead of the least recently used (`last=False`).

    A 3-block pool, three cached one-block prefixes x, y, z freed in that order; then x is used again (a
    prefix hit), so y is now the least recently used. A new request that needs two blocks must evict y,
    then z: x survives, y and z are forgotten."""
    bm = BlockManager(num_blocks=3, block_size=2)
    for rid, tokens in zip("xyz", ([1, 2], [3, 4], [5, 6])):
        _cache(bm, tokens, rid)
    assert _hit(bm, [1, 2]) == 2  # x: the most recently used from here on
    s = seq_of([7, 7, 7, 7], "new")
    bm.allocate(s, 4)
    assert _hit(bm, [1, 2]) == 2
    assert _hit(bm, [3, 4]) == 0 and _hit(bm, [5, 6]) == 0
    bm.free(s)


# ---- AsyncLLM: aborts reach the engine core ---------------------------------------------------------

LONG = 2000  # max_tokens of the request that is left or aborted


@pytest.fixture(scope="module")
def long_engine(tmp_path_factory):
    folder, _ = make_checkpoint(tmp_path_factory.mktemp("tiny_llama_4k"), max_position_embeddings=4096)
    engine = AsyncLLM(folder, max_model_len=4096, block_size=16, num_kv_blocks=300, max_num_seqs=4)
    yield engine
    engine.shutdown()


async def _core_idle(engine) -> dict:
    """The core's stats once it runs nothing (bounded wait: the stats come with the core's messages)."""
    for _ in range(1000):
        stats = engine.get_stats()
        if stats["num_running"] == stats["num_waiting"] == 0:
            return stats
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine core still runs a request: {engine.get_stats()}")


def _check_stopped_early(before: dict, after: dict) -> None:
    generated = after["num_generation_tokens"] - before["num_generation_tokens"]
    assert 1 <= generated < LONG // 2, f"the core generated {generated} of {LONG} tokens"
    assert after["num_running"] == 0
    assert after["num_free_blocks"] == after["num_total_blocks"]


def test_a_reader_that_leaves_aborts_its_request_in_the_core(long_engine):
    """Planted bug: the stream's close does not send the abort to the core (`AsyncLLM._drop` without
    `self.engine_core.abort_requests([state.core_id])`): the client is gone but the core goes on generating.

    The reader breaks after the first output of a 2000-token request; the core must stop generating it long
    before its end (num_generation_tokens counts the tokens the core generated, not those delivered) and
    give back its KV blocks."""
    params = SamplingParams(temperature=0, max_tokens=LONG, ignore_eos=True)

    async def main():
        before = await _core_idle(long_engine)
        async for _ in long_engine.generate([1, 2, 3], params, "leaver"):
            break
        return before, await _core_idle(long_engine)

    _check_stopped_early(*asyncio.run(main()))


def test_abort_reaches_the_core(long_engine):
    """Planted bug: `AsyncLLM.abort` ends the request in the frontend only (its
    `self.engine_core.abort_requests([state.core_id])` line dropped): the core goes on generating.

    After `await engine.abort(id)` on a 2000-token request that has produced its first output, the core's
    stats show it gone (nothing running, every block free) long before its end."""
    params = SamplingParams(temperature=0, max_tokens=LONG, ignore_eos=True)

    async def main():
        before = await _core_idle(long_engine)
        stream = await long_engine.add_request("aborted", [4, 5, 6], params)
        first = await stream.__anext__()
        await long_engine.abort("aborted")
        last = [out async for out in stream]
        return before, await _core_idle(long_engine), first, last

    before, after, first, last = asyncio.run(main())
    assert len(first.outputs[0].token_ids) >= 1
    assert last[-1].finished and last[-1].outputs[0].finish_reason == "abort"
    _check_stopped_early(before, after)
