"""LLM / LLMEngine end to end: greedy output equals transformers, the engine API, bad input."""
import pytest
import torch

from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def random_prompts(n, seed, low=1, high=40, vocab=211):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(low, high, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lens]


def hf_greedy(hf, prompt, n):
    out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                      max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("max_num_seqs", [8, 3])  # everyone at once; a queue
def test_greedy_matches_transformers(tiny_llama, max_num_seqs):
    folder, hf = tiny_llama
    llm = LLM(folder, max_model_len=64, block_size=16, num_kv_blocks=32, max_num_seqs=max_num_seqs)
    prompts = random_prompts(5, seed=max_num_seqs)
    outs = llm.generate(prompts, GREEDY)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, 12)
        assert o.prompt_token_ids == p and o.finished and o.outputs[0].finish_reason == "length"
    stats = llm.llm_engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_sliding_window_generation_matches_transformers(tiny_mistral):
    folder, hf = tiny_mistral  # window 7, 1 KV head for 4 query heads
    llm = LLM(folder, max_model_len=80, num_kv_blocks=20)
    prompts = random_prompts(3, seed=3, low=2, high=30)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, 20)


def test_prompt_forms_and_per_prompt_params(tiny_llama):
    llm = LLM(tiny_llama[0], max_model_len=64, num_kv_blocks=16)
    p = [3, 1, 4, 1, 5]
    a, b, c = llm.generate([p, {"prompt_token_ids": p}, p],
                           [GREEDY, GREEDY, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)])
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert c.outputs[0].token_ids == a.outputs[0].token_ids[:3]
    single = llm.generate(p, GREEDY)
    assert len(single) == 1 and single[0].outputs[0].token_ids == a.outputs[0].token_ids


def test_metrics_are_ordered(tiny_llama):
    llm = LLM(tiny_llama[0], max_model_len=64, num_kv_blocks=16)
    m = llm.generate([[1, 2, 3]], GREEDY)[0].metrics
    assert m.arrival_time <= m.first_token_time <= m.finished_time


def test_stop_tokens_eos_and_max_model_len(tiny_llama):
    folder, hf = tiny_llama
    llm = LLM(folder, max_model_len=20, num_kv_blocks=8)
    p = [7, 8, 9]
    full = llm.generate(p, GREEDY)[0].outputs[0].token_ids
    stop_at = full[4]
    out = llm.generate(p, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at]))[0].outputs[0]
    assert out.token_ids == full[:full.index(stop_at) + 1] and out.finish_reason == "stop"
    llm.llm_engine.scheduler.eos_token_ids = {stop_at}
    assert llm.generate(p, SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].finish_reason == "stop"
    assert llm.generate(p, GREEDY)[0].outputs[0].token_ids == full  # ignore_eos
    capped = llm.generate([1] * 15, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))[0].outputs[0]
    assert len(capped.token_ids) == 5 and capped.finish_reason == "length"  # 15 + 5 = max_model_len


def test_step_api_and_abort(tiny_llama):
    engine = LLM(tiny_llama[0], max_model_len=64, num_kv_blocks=16).llm_engine
    engine.add_request("a", [1, 2, 3], GREEDY)
    engine.add_request("b", [4, 5], GREEDY)
    first = engine.step()
    assert {o.request_id for o in first} == {"a", "b"} and all(len(o.outputs[0].token_ids) == 1 for o in first)
    engine.abort_request("a")
    seen = []
    while engine.has_unfinished_requests():
        seen += engine.step()
    assert {o.request_id for o in seen} == {"b"} and seen[-1].finished
    stats = engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and stats["num_running"] == stats["num_waiting"] == 0


@pytest.mark.parametrize("prompt,match", [
    ([], "empty prompt"),
    ([1, 2, 999], "outside the vocabulary"),
    ([-1], "outside the vocabulary"),
    ([1] * 64, "max_model_len"),
    ("some text", "no tokenizer"),
    ([1.5], "token ids"),
])
def test_bad_prompt_is_a_clear_error_and_the_engine_goes_on(tiny_llama, prompt, match):
    llm = LLM(tiny_llama[0], max_model_len=64, num_kv_blocks=16)
    engine = llm.llm_engine
    engine.add_request("good", [1, 2, 3], GREEDY)
    engine.step()
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", prompt, GREEDY)
    with pytest.raises(ValueError, match=match):
        llm.generate([[5, 6], prompt], GREEDY)
    while engine.has_unfinished_requests():
        outs = engine.step()
    assert outs[-1].request_id == "good" and len(outs[-1].outputs[0].token_ids) == 12
    stats = engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_bad_requests_and_options(tiny_llama):
    llm = LLM(tiny_llama[0], max_model_len=64, num_kv_blocks=16)
    llm.llm_engine.add_request("x", [1], GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        llm.llm_engine.add_request("x", [1], GREEDY)
    with pytest.raises(ValueError, match="prompts but"):
        llm.generate([[1], [2]], [GREEDY])
    for bad in (None, 5, {1, 2}):
        with pytest.raises(ValueError, match="prompts must be"):
            llm.generate(bad, GREEDY)
    with pytest.raises(ValueError, match="num_kv_blocks must be a positive integer"):  # checked at the door
        LLM(tiny_llama[0], max_model_len=64, num_kv_blocks=0)
    for bad in (dict(dtype="float8"), dict(load_format="pt"), dict(attention_backend="cuda")):
        with pytest.raises(ValueError):
            LLM(tiny_llama[0], max_model_len=64, num_kv_blocks=16, **bad)


def test_attention_backend_resolution(monkeypatch):
    from minivllm.config import EngineConfig
    assert EngineConfig("m", device="cpu").attention_backend == "torch"  # "auto" on a CPU: the reference
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        EngineConfig("m", device="cpu", attention_backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert EngineConfig("m", device="cpu", attention_backend="triton").attention_backend == "triton"


def test_cuda_graph_batch_sizes():
    from minivllm.worker.cuda_graphs import batch_size_ladder
    assert batch_size_ladder(1) == [1]
    assert batch_size_ladder(5) == [1, 2, 4, 5]
    assert batch_size_ladder(40) == [1, 2, 4, 8, 16, 32, 40]
    assert batch_size_ladder(256)[-3:] == [224, 240, 256]


def test_prepare_sends_one_flat_batch_from_the_scheduler_output(tiny_llama):
    # A decode whose first blocks were released outside a sliding window (-1) and a prefill chunk that
    # does not reach its prompt's end: the block tables are padded, holes never reach a kernel as -1,
    # and only the decode samples.
    from minivllm.core.scheduler import ScheduledSequence, SchedulerOutput
    from minivllm.core.sequence import Sequence
    from minivllm.models.loader import resolve_model
    from minivllm.worker.model_runner import ModelRunner
    runner = ModelRunner(resolve_model(tiny_llama[0]).config, "cpu", torch.float32, max_model_len=16, block_size=4,
                         max_num_seqs=2)
    long = Sequence("a", list(range(1, 11)), SamplingParams())
    long.block_table = [-1, -1, 7]                                      # decodes its 10th token
    short = Sequence("b", [5, 6, 7, 8, 9], SamplingParams())
    short.block_table = [3]                                             # prefills 3 of its 5 tokens
    step = SchedulerOutput(decodes=[ScheduledSequence(long, 9, 1, True)],
                           prefills=[ScheduledSequence(short, 0, 3, False)])
    input_ids, positions, meta, sample_index = runner.prepare(step)
    assert input_ids.tolist() == [10, 5, 6, 7] and positions.tolist() == [9, 0, 1, 2]
    assert meta.slot_mapping.tolist() == [7 * 4 + 1, 12, 13, 14]
    assert meta.block_tables.tolist() == [[0, 0, 7], [3, 0, 0]]
    assert meta.context_lens.tolist() == [10, 3] and meta.cu_seqlens_q.tolist() == [0, 1, 4]
    assert meta.num_decodes == 1 and sample_index.tolist() == [0]


@pytest.mark.parametrize("overlap", [True, False])
def test_block_table_rows_come_back_after_each_batch(tiny_llama, overlap):
    # The model runner keeps a block-table row per running sequence: rows of finished requests must come
    # back, also when the step after their end schedules nothing, or max_num_seqs rows run out.
    llm = LLM(tiny_llama[0], max_model_len=64, num_kv_blocks=32, max_num_seqs=2, async_scheduling=overlap)
    for round in range(6):  # answers of different lengths: one request ends while the other's last token is in flight
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (2 + round % 3, 3)]
        outs = llm.generate(random_prompts(2, seed=round), params)
        assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params]
    assert len(llm.llm_engine.runner.block_table.rows) <= 2


def test_prepare_takes_an_in_flight_token_from_the_device(tiny_llama):
    # With async scheduling a decode may be scheduled before its input token reached the host: its id
    # comes from the last step's sampled tensor, by that request's row in it.
    from minivllm.core.scheduler import ScheduledSequence, SchedulerOutput
    from minivllm.core.sequence import Sequence
    from minivllm.models.loader import resolve_model
    from minivllm.worker.model_runner import ModelRunner
    runner = ModelRunner(resolve_model(tiny_llama[0]).config, "cpu", torch.float32, max_model_len=16, block_size=4,
                         max_num_seqs=2)
    a, b = Sequence("a", [1, 2, 3], SamplingParams()), Sequence("b", [4, 5], SamplingParams())
    a.block_table, b.block_table = [0], [1]
    runner._last_sampled, runner._last_sampled_rows = torch.tensor([77, 88]), {"b": 0, "a": 1}
    step = SchedulerOutput(decodes=[ScheduledSequence(a, 3, 1, True), ScheduledSequence(b, 2, 1, True)])
    input_ids, positions, meta, _ = runner.prepare(step)
    assert input_ids.tolist() == [88, 77] and positions.tolist() == [3, 2]
    assert meta.slot_mapping.tolist() == [3, 6]


def test_switching_the_overlap_between_steps_changes_no_token(tiny_llama):
    # async_scheduling is read at every step (notebook 12 flips it on one engine): a step left in flight
    # when it is turned off is finished first, and the tokens stay those of a plain run.
    llm = LLM(tiny_llama[0], max_model_len=64, num_kv_blocks=32)
    engine, prompts = llm.llm_engine, random_prompts(5, seed=3)
    ref = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    for i, p in enumerate(prompts):
        engine.add_request(f"s{i}", p, GREEDY)
    got, step = {}, 0
    while engine.has_unfinished_requests():
        engine.config.async_scheduling = step % 3 != 0
        got |= {o.request_id: o.outputs[0].token_ids for o in engine.step()}
        step += 1
    assert [got[f"s{i}"] for i in range(len(prompts))] == ref
    assert engine.get_stats()["num_free_blocks"] == engine.get_stats()["num_total_blocks"]
