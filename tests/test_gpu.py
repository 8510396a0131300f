"""On the GPU: the engine agrees with transformers there too. Skipped without CUDA; run on the
GPU machine with `python -m pytest -m gpu tests/test_gpu.py`."""
import pytest
import torch
from markers import needs_smollm2

from minivllm import LLM, SamplingParams
from minivllm.models.loader import resolve_model
from minivllm_lab.machine import free_memory

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("options", [
    dict(),                                             # Triton kernels, CUDA graphs, paged, continuous, prefix cache
    dict(block_size=4, num_kv_blocks=36, max_num_batched_tokens=7),   # preemption and chunking
    dict(enable_paged_kv=False, enable_continuous_batching=False, enable_chunked_prefill=False),
    dict(enforce_eager=True),                           # Triton kernels without CUDA graphs
    dict(attention_backend="torch"),                    # the torch reference attention
    dict(attention_backend="torch", block_size=4, num_kv_blocks=36, max_num_batched_tokens=7),
    dict(max_num_seqs=5, block_size=5),                 # odd block size; 3 decodes padded to a graph of 4
    dict(async_scheduling=False),                       # the CPU's and the GPU's work one after the other
    dict(async_scheduling=False, block_size=4, num_kv_blocks=36, max_num_batched_tokens=7),
])
def test_greedy_matches_transformers_on_the_gpu(tiny_llama, tiny_mistral, options):
    from transformers import AutoModelForCausalLM
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (4, 19, 33)]
    for folder, _ in (tiny_llama, tiny_mistral):
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda()
        llm = LLM(folder, dtype="float32", max_model_len=96, **({"num_kv_blocks": 24, "max_num_seqs": 8} | options))
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
        for p, o in zip(prompts, outs):
            ids = torch.tensor([p], device="cuda")
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24,
                              do_sample=False)[0, len(p):].tolist()
            assert o.outputs[0].token_ids == ref


def test_requests_ending_while_a_step_is_in_flight_on_the_gpu(tiny_llama):
    # With CUDA graphs and real streams: requests that stop on a token or are aborted while the next
    # step holds them. The overlapped engine gives the serial one's tokens, and no block leaks.
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (4, 19, 33, 7, 12)]
    results = []
    for overlap in (True, False):
        llm = LLM(tiny_llama[0], dtype="float32", max_model_len=96, num_kv_blocks=24, max_num_seqs=8,
                  async_scheduling=overlap)
        greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
        params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                 stop_token_ids=[o.outputs[0].token_ids[4]]) for o in greedy]
        results.append([o.outputs[0].token_ids for o in greedy + llm.generate(prompts, params)])
        engine = llm.llm_engine
        for i, p in enumerate(prompts):
            engine.add_request(f"abort-{i}", p, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
        for _ in range(4):
            engine.step()
        for i in range(0, len(prompts), 2):
            engine.abort_request(f"abort-{i}")
        while engine.has_unfinished_requests():
            engine.step()
        stats = engine.get_stats()
        assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert results[0] == results[1]


def test_bf16_logits_close_to_float32(tiny_llama):
    from minivllm.attention import NoCacheMetadata
    from minivllm.models.loader import build_model
    source = resolve_model(tiny_llama[0])
    ids = torch.randint(0, 211, (40,), device="cuda")
    meta = NoCacheMetadata(torch.tensor([0, 40], device="cuda", dtype=torch.int32), 40)
    logits = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = build_model(source.config, "cuda", dtype, 64, source.folder)
        with torch.no_grad():
            logits[dtype] = model.compute_logits(model(ids, torch.arange(40, device="cuda"), meta))
    err = (logits[torch.bfloat16] - logits[torch.float32]).norm() / logits[torch.float32].norm()
    assert err < 2e-2


def test_mistral_7b_dummy_runs_a_batch():
    llm = LLM("mistral-7b", load_format="dummy", max_model_len=256, num_kv_blocks=64)
    assert llm.llm_engine.dtype == torch.bfloat16
    outs = llm.generate([[1, 2, 3], list(range(5, 100))], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 4]


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 5e-2)])
def test_mixed_steps_replay_cuda_graphs(tiny_llama, tiny_mistral, dtype, tol):
    # Prompts chunked beside decodes (24 tokens a step): the steps with a chunk replay a mixed graph, padded to
    # its token count and sequence count. Each one's logits are compared with an eager forward of the same step,
    # and in float32 the tokens with the eager engine's.
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    prompts = [torch.randint(0, 211, (int(n),), generator=g).tolist() for n in torch.randint(3, 60, (6,), generator=g)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for folder, _ in (tiny_llama, tiny_mistral):
        args = dict(dtype=dtype, max_model_len=96, num_kv_blocks=64, max_num_seqs=8, max_num_batched_tokens=24)
        eager = LLM(folder, enforce_eager=True, **args).generate(prompts, params, use_tqdm=False)
        llm = LLM(folder, **args)
        runner, compared = llm.llm_engine.runner, []
        graphed_execute = runner.execute_batch

        def both(layout, flat=None):
            logits = graphed_execute(layout, flat)
            batch = runner._unpack(flat, layout)
            if batch.metadata.num_decodes < batch.metadata.num_seqs:
                meta = runner.attn_backend.build_metadata(batch.metadata)
                hidden = runner.model(batch.input_ids, batch.positions, meta)
                torch.testing.assert_close(logits, runner.model.compute_logits(hidden[batch.sample_index]),
                                           rtol=tol, atol=tol)
                compared.append(batch.input_ids.shape[0])
            return logits

        runner.execute_batch = both
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert runner.graph_replays["mixed"] == len(compared) > 3 and runner.graph_replays["decode"] > 0
        if dtype == "float32":
            assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in eager]


def launch_steps_checked(llm, prompts, params) -> list[int]:
    """Generate with the engine core's `_launch` (schedule, pack, forward, sample) under torch's sync debug mode
    "error": a call that waits for the GPU raises there. Returns each launched step's token count."""
    core, tokens = llm.llm_engine.engine_core, []
    launch, execute = core._launch, core.executor.execute_model

    def counted(scheduler_output):
        tokens.append(sum(e.num_tokens for e in scheduler_output.entries))
        return execute(scheduler_output)

    def checked(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    core._launch, core.executor.execute_model = checked, counted
    try:
        llm.generate(prompts, params, use_tqdm=False)
    finally:
        core._launch, core.executor.execute_model = launch, execute
    return tokens


def test_steps_launch_without_waiting_for_the_gpu(tiny_llama):
    # Async scheduling plans step n+1 while step n runs only if nothing before its launch waits for the GPU: not
    # the schedule, the packing, a decode graph, a mixed graph, an eager step past the largest graph, nor greedy,
    # random or seeded sampling. Only reading a step's tokens waits (outside `_launch`).
    from minivllm.worker.cuda_graphs import MAX_MIXED_GRAPH_TOKENS
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    lens = torch.randint(70, 90, (40,), generator=g).tolist()
    prompts = [torch.randint(0, 211, (n,), generator=g).tolist() for n in lens]
    params = [SamplingParams(temperature=[0, 0.8][i % 2], seed=i if i % 4 == 1 else None, max_tokens=4 + i % 17,
                             ignore_eos=True) for i in range(len(prompts))]
    llm = LLM(tiny_llama[0], dtype="bfloat16", max_model_len=128, num_kv_blocks=320, max_num_seqs=32,
              max_num_batched_tokens=4096)
    llm.generate(prompts[:4], params[:4], use_tqdm=False)  # Triton compiles outside the check
    runner = llm.llm_engine.runner
    before = dict(runner.graph_replays)
    tokens = launch_steps_checked(llm, prompts, params)
    assert max(tokens) > MAX_MIXED_GRAPH_TOKENS                       # the first step, eager
    assert runner.graph_replays["decode"] > before.get("decode", 0)
    assert runner.graph_replays["mixed"] > before.get("mixed", 0)    # newcomers beside decodes


def test_enforce_eager_captures_no_graph(tiny_llama):
    runner = LLM(tiny_llama[0], max_model_len=96, num_kv_blocks=24, enforce_eager=True).llm_engine.runner
    assert runner.graphs is None and runner.graph_memory_bytes == 0


def test_the_graphs_memory_is_kept_out_of_the_kv_cache(tiny_llama):
    # Same budget, with and without graphs: the graphed engine's pool is smaller by about the graphs' memory.
    # The budget is 2 GiB above what this process holds already: the limit counts every tensor of the process,
    # and earlier tests of the session may still hold some.
    free_memory()
    limit = torch.cuda.memory_allocated() + 2 * 2**30
    pools = {}
    for eager in (True, False):
        llm = LLM(tiny_llama[0], max_model_len=96, gpu_memory_limit_bytes=limit, gpu_memory_utilization=1.0,
                  enforce_eager=eager, max_num_seqs=8, max_num_batched_tokens=256)  # device-sized ones fill 2 GiB
        pools[eager] = llm.llm_engine.get_stats()["num_total_blocks"], llm.llm_engine.runner.graph_memory_bytes
        llm.shutdown()
        del llm
        free_memory()
    (eager_blocks, _), (graphed_blocks, graph_bytes) = pools[True], pools[False]
    assert graph_bytes > 0 and graphed_blocks < eager_blocks


def _spec_runs(folder, prompts, **options):
    """Greedy tokens of `prompts` and the engine, built with the given options."""
    llm = LLM(folder, dtype="float32", max_model_len=96, num_kv_blocks=48, max_num_seqs=4, **options)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)], llm.llm_engine


@pytest.mark.parametrize("model, batch", [("llama", 1), ("llama", 3), ("mistral", 3)])
def test_verify_steps_replay_cuda_graphs_with_the_same_tokens(tiny_llama, tiny_mistral, model, batch):
    # Prompts that repeat themselves, so that the n-gram proposer finds guesses; 3 sequences replay the verify
    # graph of 4 (one padding sequence), and steps where some sequences have fewer guesses than k, or none.
    folder = (tiny_llama if model == "llama" else tiny_mistral)[0]
    g = torch.Generator().manual_seed(2)
    prompts = [(torch.randint(0, 211, (6,), generator=g).tolist() * 3)[:n] for n in (18, 11, 15)[:batch]]
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    plain, _ = _spec_runs(folder, prompts)
    graphed, engine = _spec_runs(folder, prompts, speculative_config=ngram)
    eager, eager_engine = _spec_runs(folder, prompts, speculative_config=ngram, enforce_eager=True)
    assert graphed == plain and eager == plain
    assert engine.runner.graph_replays["verify"] > 0 and not eager_engine.runner.graph_replays
    assert engine.get_stats()["num_accepted_tokens"] > 0


def test_a_draft_models_runner_replays_cuda_graphs_too(tiny_llama):
    # The target as its own draft: every guess kept; the draft's guesses are decode graphs, its catch-up after
    # each verify (the last guess and the bonus token) a verify-shaped graph of which only the last row samples.
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (5, 17, 9)]
    spec = {"method": "draft_model", "model": tiny_llama[0], "num_speculative_tokens": 3}
    plain, _ = _spec_runs(tiny_llama[0], prompts)
    graphed, engine = _spec_runs(tiny_llama[0], prompts, speculative_config=spec)
    assert graphed == plain
    stats = engine.get_stats()
    assert stats["num_accepted_tokens"] == stats["num_draft_tokens"] > 0
    draft_replays = engine.proposer.runner.graph_replays
    assert engine.runner.graph_replays["verify"] > 0 and draft_replays["decode"] > 0 and draft_replays["verify"] > 0


@needs_smollm2
def test_json_schemas_logprobs_and_n_answers_on_the_gpu():
    # The OpenAI extras on real SmolLM2 with CUDA graphs and the overlap on: the bitmask filled on the CPU reaches
    # the GPU's sampler (every answer validates), logprobs come back from the GPU's sampler, and n = 4 answers on
    # shared blocks are the answers of seeds 7..10 alone. Then the overlap off gives the same greedy answers.
    import json

    import jsonschema

    from minivllm import StructuredOutputsParams
    pytest.importorskip("xgrammar")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"]}
    prompts = [f"Describe person number {i} as JSON with the keys name and age." for i in range(12)]
    answers = []
    for overlap in (True, False):
        # (a pool of its own size: earlier tests of the session may still hold GPU memory)
        llm = LLM("smollm2-135m", dtype="float32", max_model_len=512, num_kv_blocks=256, async_scheduling=overlap)
        spec = StructuredOutputsParams(json=schema)
        params = [SamplingParams(temperature=t, seed=i, max_tokens=64, logprobs=2, structured_outputs=spec)
                  for i, t in enumerate([0.0, 1.0] * 6)]
        outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
        for out in outs:
            jsonschema.validate(json.loads(out.outputs[0].text), schema)
            assert len(out.outputs[0].logprobs) == len(out.outputs[0].token_ids)
        answers.append([o.outputs[0].token_ids for o, p in zip(outs, params) if p.temperature == 0])
        sampling = dict(temperature=1.0, max_tokens=16, ignore_eos=True, frequency_penalty=0.5)
        prompt = list(range(100, 150))
        (together,) = llm.generate([prompt], SamplingParams(n=4, seed=7, **sampling), use_tqdm=False)
        alone = llm.generate([prompt] * 4, [SamplingParams(seed=7 + i, **sampling) for i in range(4)],
                             use_tqdm=False)
        assert [c.token_ids for c in together.outputs] == [o.outputs[0].token_ids for o in alone]
        stats = llm.llm_engine.get_stats()
        assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert answers[0] == answers[1]
