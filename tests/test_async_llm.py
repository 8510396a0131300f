"""AsyncLLM: streams equal the offline engine, bad input fails alone, readers that leave abort, nothing leaks."""
import asyncio
import random

import pytest

from conftest import make_checkpoint
from minivllm import LLM, AsyncLLM, SamplingParams
from minivllm.engine.async_llm import EngineDeadError

ENGINE = dict(max_model_len=128, block_size=8, num_kv_blocks=40, max_num_seqs=6)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    engine = AsyncLLM(tiny_llama[0], **ENGINE)
    yield engine
    engine.shutdown()


def prompts(n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(211) for _ in range(rng.randint(1, 30))] for _ in range(n)]


async def settled(engine):
    """Wait (boundedly) until the engine is idle; return its stats."""
    for _ in range(500):
        stats = engine.get_stats()
        if stats["num_running"] == stats["num_waiting"] == 0 and not engine.llm_engine.requests:
            return stats
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine never settled: {engine.get_stats()}")


async def collect(engine, prompt, params, request_id):
    outs = [out async for out in engine.generate(prompt, params, request_id)]
    return outs


def test_concurrent_streams_equal_the_offline_engine(engine, tiny_llama):
    ps = prompts(9, seed=random.randrange(10**6))  # more requests than max_num_seqs: some queue
    params = [SamplingParams(temperature=0, max_tokens=random.randint(1, 20), ignore_eos=True) for _ in ps]

    async def main():
        return await asyncio.gather(*[collect(engine, p, sp, f"c{i}") for i, (p, sp) in enumerate(zip(ps, params))])

    streams = asyncio.run(main())
    offline = LLM(tiny_llama[0], **ENGINE).generate(ps, params, use_tqdm=False)
    for outs, ref, sp in zip(streams, offline, params):
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert outs[-1].outputs[0].token_ids == ref.outputs[0].token_ids
        # Cumulative, one output per step that made a token (prefill chunks make none).
        assert [len(o.outputs[0].token_ids) for o in outs] == list(range(1, sp.max_tokens + 1))
    stats = asyncio.run(settled(engine))
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_bad_input_fails_alone(engine):
    async def main():
        good = asyncio.create_task(collect(engine, [1, 2, 3], SamplingParams(temperature=0, max_tokens=8), "good"))
        for bad in ([], [10**6], list(range(200)), "text but no tokenizer"):
            with pytest.raises(ValueError):
                await collect(engine, bad, SamplingParams(max_tokens=4), f"bad{len(bad)}")
        with pytest.raises(ValueError, match="already in use"):
            await asyncio.gather(collect(engine, [5], SamplingParams(max_tokens=50), "dup"),
                                 collect(engine, [6], SamplingParams(max_tokens=50), "dup"))
        return await good

    outs = asyncio.run(main())
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) >= 1
    stats = asyncio.run(settled(engine))
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.fixture(scope="module")
def long_engine(tmp_path_factory):
    """Room for a request far longer than the time a busy machine may take to notice its reader left."""
    folder, _ = make_checkpoint(tmp_path_factory.mktemp("long_llama"), max_position_embeddings=4096)
    engine = AsyncLLM(folder, **{**ENGINE, "max_model_len": 4096, "num_kv_blocks": 560})
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("how", ["break", "cancel", "abort"])
def test_a_reader_that_leaves_aborts_its_request(long_engine, how):
    engine = long_engine
    params = SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True)

    async def main():
        seen = []

        async def reader(request_id):
            async for out in engine.generate([7, 8, 9], params, request_id):
                seen.append(out)
                if how == "break" and len(seen) == 3:
                    break
        others = [asyncio.create_task(collect(engine, p, SamplingParams(temperature=0, max_tokens=10), f"o{how}{i}"))
                  for i, p in enumerate(prompts(3, seed=1))]
        task = asyncio.create_task(reader(f"leaver-{how}"))
        while len(seen) < 3 and not task.done():
            await asyncio.sleep(0.001)
        if how == "cancel":
            task.cancel()
        elif how == "abort":
            await engine.abort(f"leaver-{how}")
        await asyncio.gather(task, return_exceptions=True)
        done = await asyncio.gather(*others)
        return seen, done

    seen, others = asyncio.run(main())
    assert all(o[-1].finished and len(o[-1].outputs[0].token_ids) == 10 for o in others)  # the rest went on
    assert len(seen[-1].outputs[0].token_ids) < 4000
    if how == "abort":  # the reader hears of it: a last output, finished by abort
        assert seen[-1].finished and seen[-1].outputs[0].finish_reason == "abort"
    stats = asyncio.run(settled(engine))
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_shutdown_stops_the_engine_thread(tiny_llama):
    engine = AsyncLLM(tiny_llama[0], **ENGINE)

    async def main():
        task = asyncio.create_task(collect(engine, [1, 2], SamplingParams(max_tokens=100, ignore_eos=True), "x"))
        await asyncio.sleep(0.05)
        await asyncio.to_thread(engine.shutdown)
        return await task

    outs = asyncio.run(main())
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason in ("abort", "length")
    assert not engine.is_running
    with pytest.raises(EngineDeadError):
        asyncio.run(collect(engine, [1], SamplingParams(), "after"))


def test_unknown_keyword_names_asyncllm(tiny_llama):
    with pytest.raises(TypeError, match=r"AsyncLLM\(\) got unknown keyword"):
        AsyncLLM(tiny_llama[0], max_model_length=10)


def test_a_reader_leaving_late_does_not_abort_a_new_request_with_its_id(engine):
    # The first "reuse" request has finished (its last output waits unread in its stream) when a new
    # request takes the same id; the old reader then leaves. Only the old request may be affected.
    async def main():
        old = await engine.add_request("reuse", [1, 2, 3], SamplingParams(temperature=0, max_tokens=1))
        await settled(engine)
        new = await engine.add_request("reuse", [4, 5, 6], SamplingParams(temperature=0, max_tokens=12,
                                                                          ignore_eos=True))
        old.close()

        async def read():
            return [out async for out in new]
        return await asyncio.wait_for(read(), timeout=60)  # the bug this guards against left `new` silent

    outs = asyncio.run(main())
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
    assert len(outs[-1].outputs[0].token_ids) == 12
