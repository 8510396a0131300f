"""Tensor parallelism on the CPU: 2 (and 4) gloo ranks give transformers' greedy tokens, each rank
holds exactly its slice of the checkpoint, workers stop with the engine, a dead worker is an error.

Each engine here starts real worker processes (`python -m minivllm.executor`); anything that
could hang if the engine were wrong runs under a deadline instead.
"""
import os
import signal
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_engine import random_prompts

from minivllm import LLM, SamplingParams
from minivllm.distributed import parallel_state
from minivllm.models.loader import build_model, resolve_model
from minivllm_lab.bench.profile import time_all_reduce

N = 16  # new tokens per request
DEADLINE_S = 300


def run_with_deadline(fn, seconds=DEADLINE_S):
    """fn() in a daemon thread: its result, its exception, or a failure if it has not returned in time."""
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # handed to the test's thread
            box["error"] = e
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running after {seconds} s: a hang")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def worker_pids() -> set[int]:
    """The live tensor-parallel worker processes started from this test process (directly, or by a
    server it started): other sessions' processes on the machine do not count."""
    parents, commands = {}, {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            commands[int(proc.name)] = (proc / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if stat[0] != "Z":  # a zombie has exited
            parents[int(proc.name)] = int(stat[1])

    def descends_from_us(pid):
        while pid in parents and pid > 1:
            pid = parents[pid]
            if pid == os.getpid():
                return True
        return False
    return {pid for pid in parents if b"minivllm.executor" in commands.get(pid, b"") and descends_from_us(pid)}


@torch.no_grad()
def hf_greedy_without_cache(hf, prompt, n):
    """transformers' greedy tokens by a whole forward per token. (Its `generate()` with a sliding window
    shorter than the prompt can differ from its own forward: with window 7 it did on one of these
    prompts, at the fifth token, with a margin of 0.05 in the logits. The forward is the model's math.)"""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


@pytest.fixture(scope="module")
def references(tiny_llama, tiny_mistral):
    prompts = random_prompts(5, seed=7, low=1, high=40)
    return {name: (folder, prompts, [hf_greedy_without_cache(hf, p, N) for p in prompts])
            for name, (folder, hf) in {"llama": tiny_llama, "mistral": tiny_mistral}.items()}


# ---- each rank loads its slice ----------------------------------------------------------------
@pytest.fixture
def as_rank(monkeypatch):
    """Build models as rank `rank` of `size` would, without starting any process."""
    def enter(rank, size):
        monkeypatch.setattr(parallel_state, "_rank", rank)
        monkeypatch.setattr(parallel_state, "_size", size)
    return enter


@pytest.mark.parametrize("model", ["llama", "mistral"])
def test_each_rank_holds_its_rows_and_columns(references, as_rank, model):
    folder = references[model][0]
    whole = load_file(str(Path(folder) / "model.safetensors"))
    source = resolve_model(folder)
    cfg = source.config
    d, heads, kv_heads = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    for rank in range(2):
        as_rank(rank, 2)
        layer = build_model(cfg, "cpu", torch.float32, 64, source.folder).model.layers[1]
        prefix = "model.layers.1."
        q = whole[prefix + "self_attn.q_proj.weight"][rank * heads // 2 * d:(rank + 1) * heads // 2 * d]
        kv_head = rank * kv_heads // 2  # llama: 2 KV heads, one per rank; mistral: 1, on both ranks
        kv_rows = slice(kv_head * d, (kv_head + max(1, kv_heads // 2)) * d)
        k, v = whole[prefix + "self_attn.k_proj.weight"][kv_rows], whole[prefix + "self_attn.v_proj.weight"][kv_rows]
        assert torch.equal(layer.self_attn.qkv_proj.weight, torch.cat([q, k, v]))
        cols = slice(rank * heads // 2 * d, (rank + 1) * heads // 2 * d)
        assert torch.equal(layer.self_attn.o_proj.weight, whole[prefix + "self_attn.o_proj.weight"][:, cols])
        width = cfg.intermediate_size // 2
        rows = slice(rank * width, (rank + 1) * width)
        gate_up = torch.cat([whole[prefix + "mlp.gate_proj.weight"][rows], whole[prefix + "mlp.up_proj.weight"][rows]])
        assert torch.equal(layer.mlp.gate_up_proj.weight, gate_up)
        assert torch.equal(layer.mlp.down_proj.weight, whole[prefix + "mlp.down_proj.weight"][:, rows])


def test_odd_vocabulary_is_padded(references, as_rank):
    folder = references["llama"][0]
    source = resolve_model(folder)
    embed = load_file(str(Path(folder) / "model.safetensors"))["model.embed_tokens.weight"]
    assert embed.shape[0] == 211  # prime: no number of ranks divides it
    as_rank(1, 2)
    model = build_model(source.config, "cpu", torch.float32, 64, source.folder)
    mine = model.model.embed_tokens.weight
    assert mine.shape[0] == 106  # ceil(211 / 2) rows per rank; rank 1 holds 105 real ones and a padding row
    assert torch.equal(mine[:105], embed[106:]) and not mine[105].any()


# ---- whole engines -------------------------------------------------------------------------------
OPTIONS = {
    "default": {},
    "tiny pool (preemption) and tiny budget (chunked prefill)": dict(block_size=4, num_kv_blocks=20,
                                                                     max_num_batched_tokens=7),
    "no overlap, no prefix caching": dict(async_scheduling=False, enable_prefix_caching=False),
    "pool sized by the ranks (the smallest wins)": dict(num_kv_blocks=None),
    # The verify forward of k + 1 tokens per sequence is broadcast like any step; rank 0 samples and checks.
    "speculative decoding (n-gram)": dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3}),
}


@pytest.mark.parametrize("model,option", [(m, o) for m in ("llama", "mistral") for o in OPTIONS])
def test_two_ranks_give_transformers_greedy_tokens(references, model, option):
    folder, prompts, refs = references[model]
    before = worker_pids()
    args = dict(max_model_len=80, block_size=16, num_kv_blocks=40) | OPTIONS[option]
    llm = run_with_deadline(lambda: LLM(folder, tensor_parallel_size=2, **args))
    try:
        started = worker_pids() - before
        assert len(started) == 1  # rank 1; rank 0 is this process
        outs = run_with_deadline(lambda: llm.generate(prompts, SamplingParams(temperature=0, max_tokens=N,
                                                                              ignore_eos=True), use_tqdm=False))
        assert [o.outputs[0].token_ids for o in outs] == refs
        stats = llm.llm_engine.get_stats()
        assert stats["num_free_blocks"] == stats["num_total_blocks"]
        if "preemption" in option and model == "llama":  # (Mistral's window frees blocks as it goes)
            assert stats["num_preemptions"] > 0
    finally:
        run_with_deadline(llm.shutdown, 60)
    assert not started & worker_pids()  # the worker is gone


@pytest.mark.slow
def test_four_ranks_replicate_the_kv_heads(references):
    """4 ranks, 2 KV heads: each head is held by two ranks."""
    folder, prompts, refs = references["llama"]
    llm = run_with_deadline(lambda: LLM(folder, tensor_parallel_size=4, max_model_len=80, num_kv_blocks=40))
    try:
        outs = run_with_deadline(lambda: llm.generate(prompts[:3], SamplingParams(temperature=0, max_tokens=N,
                                                                                  ignore_eos=True), use_tqdm=False))
        assert [o.outputs[0].token_ids for o in outs] == refs[:3]
    finally:
        run_with_deadline(llm.shutdown, 60)


@pytest.mark.slow
def test_two_ranks_with_the_triton_kernels(references):
    """The fused kernels (Triton's interpreter on a CPU) on each rank's slice of the heads."""
    folder, prompts, refs = references["mistral"]
    llm = run_with_deadline(lambda: LLM(folder, tensor_parallel_size=2, max_model_len=80, num_kv_blocks=40,
                                        attention_backend="triton", max_num_batched_tokens=16))
    try:
        outs = run_with_deadline(lambda: llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=8,
                                                                                  ignore_eos=True), use_tqdm=False))
        assert [o.outputs[0].token_ids for o in outs] == [r[:8] for r in refs[:2]]
    finally:
        run_with_deadline(llm.shutdown, 60)


def test_a_worker_that_dies_is_a_clear_error(references):
    folder, prompts, _ = references["llama"]
    llm = run_with_deadline(lambda: LLM(folder, tensor_parallel_size=2, max_model_len=80, num_kv_blocks=40))
    engine = llm.llm_engine
    try:
        engine.add_request("a", prompts[0], SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))
        run_with_deadline(engine.step)  # a step in flight when the worker dies
        worker = next(iter(engine.executor.workers.processes.values()))
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        with pytest.raises(RuntimeError, match="worker 1 .* has died"):
            run_with_deadline(lambda: [engine.step() for _ in range(N + 2)])
    finally:
        run_with_deadline(llm.shutdown, 60)


def test_a_worker_that_cannot_start_says_why(references, monkeypatch):
    """Rank 1 is sent to a device it does not have: its own error reaches the caller, nothing is left."""
    from minivllm.executor import workers
    monkeypatch.setattr(workers, "rank_device", lambda device, rank: "cuda:7" if rank else device)
    before = worker_pids()
    with pytest.raises(RuntimeError, match="(?s)worker 1 failed to start.*cuda"):
        run_with_deadline(lambda: LLM(references["llama"][0], tensor_parallel_size=2, max_model_len=80,
                                      num_kv_blocks=40))
    assert not worker_pids() - before
    assert parallel_state.tp_size() == 1  # this process has left the group: a new engine can start


def test_a_failure_on_rank_0_in_a_step_stops_the_workers_and_says_why(references):
    """The workers are inside the step when rank 0 fails in it: they are stopped (they would wait for rank 0
    forever), and the engine's next call says why instead of hanging."""
    folder, prompts, _ = references["llama"]
    before = worker_pids()
    llm = run_with_deadline(lambda: LLM(folder, tensor_parallel_size=2, max_model_len=80, num_kv_blocks=40))
    try:
        def boom(hidden):
            raise MemoryError("rank 0 ran out of memory")
        llm.llm_engine.runner.model.compute_logits = boom  # rank 0's model only
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        with pytest.raises(MemoryError):
            run_with_deadline(lambda: llm.generate(prompts[:1], params, use_tqdm=False))
        assert not worker_pids() - before
        with pytest.raises(RuntimeError, match="cannot run: rank 0 failed in execute_batch"):
            run_with_deadline(lambda: llm.llm_engine.executor.collective_rpc("initialize_kv_cache", 8))
    finally:
        run_with_deadline(llm.shutdown, 60)
    assert parallel_state.tp_size() == 1


def test_one_split_engine_per_process_and_keywords_reach_every_rank(references):
    folder = references["llama"][0]
    llm = run_with_deadline(lambda: LLM(folder, tensor_parallel_size=2, max_model_len=80, num_kv_blocks=40))
    try:
        with pytest.raises(RuntimeError, match="a tensor-parallel engine is running in this process"):
            LLM(folder, max_model_len=80, num_kv_blocks=40)
        # a keyword argument reaches the workers too: both ranks make the same number of collectives
        times = run_with_deadline(lambda: llm.llm_engine.executor.collective_rpc(time_all_reduce, 1, repeats=3), 60)
        assert len(times) == 3
    finally:
        run_with_deadline(llm.shutdown, 60)
    LLM(folder, max_model_len=80, num_kv_blocks=40)  # after shutdown, another engine may start


def test_a_split_that_does_not_divide_the_heads_is_refused_at_once(references):
    folder = references["llama"][0]  # 4 heads, 2 KV heads
    before = worker_pids()
    with pytest.raises(ValueError, match="must divide the 4 attention heads"):
        LLM(folder, tensor_parallel_size=3)
    assert worker_pids() == before


@pytest.mark.slow
def test_the_server_splits_smollm2_over_three_ranks():
    """`minivllm serve --tensor-parallel-size 3` (SmolLM2: 9 heads, 3 KV heads) answers as one rank
    does, through the official client; stopping the server stops its workers."""
    import openai
    from server_utils import running_server

    question = [{"role": "user", "content": "What is the capital of France?"}]
    llm = LLM("smollm2-135m", max_model_len=256, num_kv_blocks=32, device="cpu", dtype="float32")
    reference = llm.chat(question, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0].outputs[0]
    before = worker_pids()
    with running_server("smollm2-135m", "--max-model-len", "256", "--num-kv-blocks", "32",
                        "--tensor-parallel-size", "3") as base_url:
        assert len(worker_pids() - before) == 2
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="none", timeout=DEADLINE_S)
        answer = client.chat.completions.create(model="smollm2-135m", messages=question, temperature=0,
                                                max_tokens=16)
        assert answer.choices[0].message.content == reference.text
    for _ in range(100):  # the workers leave right after the server
        if not worker_pids() - before:
            break
        threading.Event().wait(0.1)
    assert not worker_pids() - before
