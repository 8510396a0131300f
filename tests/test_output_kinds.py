"""SamplingParams.output_kind (vLLM's RequestOutputKind): cumulative outputs, deltas, or the final one only,
from LLMEngine.step and from an AsyncLLM stream. Deltas joined give the cumulative output, token for token,
text and logprobs too."""
import asyncio
import random

import pytest

from minivllm import LLM, AsyncLLM, RequestOutputKind, SamplingParams

ENGINE = dict(max_model_len=64, num_kv_blocks=32, block_size=4)


def params(kind, **kw):
    return SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1, output_kind=kind, **kw)


def run_engine(engine, prompt, sampling_params, request_id):
    engine.add_request(request_id, prompt, sampling_params)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == request_id]
    return outs


def joined(outs, index=0):
    tokens = [t for o in outs for t in o.outputs[index].token_ids]
    logprobs = [d for o in outs for d in o.outputs[index].logprobs]
    return tokens, "".join(o.outputs[index].text for o in outs), logprobs


def test_cumulative_delta_and_final_only_from_the_engine(tiny_llama):
    engine = LLM(tiny_llama[0], **ENGINE).llm_engine
    prompt = [random.Random().randrange(211) for _ in range(9)]
    cumulative = run_engine(engine, prompt, params(RequestOutputKind.CUMULATIVE, n=2, seed=3), "c")
    delta = run_engine(engine, prompt, params(RequestOutputKind.DELTA, n=2, seed=3), "d")
    final = run_engine(engine, prompt, params(RequestOutputKind.FINAL_ONLY, n=2, seed=3), "f")
    assert len(final) == 1 and final[0].finished and len(delta) > 1 and delta[-1].finished
    last = cumulative[-1]
    for i in range(2):
        assert [len(o.outputs[i].token_ids) for o in delta if o.outputs[i].token_ids] != []
        tokens, text, logprobs = joined(delta, i)
        assert tokens == last.outputs[i].token_ids == final[0].outputs[i].token_ids
        assert text == last.outputs[i].text
        assert [list(d) for d in logprobs] == [list(d) for d in last.outputs[i].logprobs]
        assert [d[t].logprob for d, t in zip(logprobs, tokens)] == pytest.approx(
            [d[t].logprob for d, t in zip(last.outputs[i].logprobs, tokens)], abs=1e-5)
    assert sum(len(o.outputs[0].token_ids) for o in delta) == 12  # no token twice
    assert engine.get_stats()["num_free_blocks"] == engine.get_stats()["num_total_blocks"]


def test_bad_output_kind_is_a_value_error():
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind="delta")


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY])
def test_a_stream_gives_deltas_or_the_final_output(tiny_llama, kind):
    engine = AsyncLLM(tiny_llama[0], engine_core_process=False, **ENGINE)
    prompt = [5, 6, 7, 8]

    async def collect(p):
        return [out async for out in engine.generate(prompt, p)]

    try:
        reference = asyncio.run(collect(params(RequestOutputKind.CUMULATIVE)))[-1]
        outs = asyncio.run(collect(params(kind)))
    finally:
        engine.shutdown()
    assert outs[-1].finished and joined(outs)[:2] == (reference.outputs[0].token_ids, reference.outputs[0].text)
    if kind == RequestOutputKind.FINAL_ONLY:
        assert len(outs) == 1
