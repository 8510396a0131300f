"""Tests of minivllm_lab.bench: workloads, metrics and the roofline calculator (CPU, fast)."""

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from minivllm_lab.bench import metrics, roofline, workloads
from minivllm_lab.bench.roofline import MISTRAL_7B

H200_BW, H200_FLOPS = roofline.H200_BANDWIDTH_BPS, roofline.H200_MATMUL_FLOPS


# --- workloads ---------------------------------------------------------------------------------


def test_w1_shape_ranges_and_determinism():
    w = workloads.w1(32000)
    assert w.name == "W1" and len(w.prompts) == 60
    assert all(16 <= len(p) <= 256 for p in w.prompts)
    assert all(100 <= t < 32000 for p in w.prompts for t in p)
    assert w.max_tokens == [150] * 60 and w.num_output_tokens == 9000
    assert w == workloads.w1(32000)
    assert w != workloads.w1(32000, seed=1)


def test_w2_shape_ranges_and_matches_nano_vllm():
    w = workloads.w2(32000)
    assert len(w.prompts) == len(w.max_tokens) == 256
    assert all(100 <= len(p) <= 1024 for p in w.prompts)
    assert all(100 <= n <= 1024 for n in w.max_tokens)
    assert all(100 <= t < 32000 for p in w.prompts for t in p)
    # nano-vllm's README reports this total for its bench.py: same draws, same lengths.
    assert w.num_output_tokens == 133966
    assert w == workloads.w2(32000)


def test_smoke_sized_workloads_and_tiny_vocab():
    w = workloads.w1(32000, num_requests=4, max_prompt=32, output_len=8)
    assert len(w.prompts) == 4 and all(16 <= len(p) <= 32 for p in w.prompts) and w.num_output_tokens == 32
    w = workloads.w2(50, num_requests=3, min_len=2, max_len=5)
    assert all(25 <= t < 50 for p in w.prompts for t in p)
    with pytest.raises(ValueError):
        workloads.w1(32000, min_prompt=10, max_prompt=5)


# --- metrics -----------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 1, 37.5, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    values = np.random.default_rng(0).exponential(size=101)
    assert metrics.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert metrics.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 == metrics.median([4, 1, 3, 2])


def _output(n_tokens, arrival, first, finished):
    return SimpleNamespace(
        outputs=[SimpleNamespace(token_ids=list(range(n_tokens)))],
        metrics=SimpleNamespace(arrival_time=arrival, first_token_time=first, finished_time=finished),
    )


def test_summarize_by_hand():
    outs = [
        _output(5, arrival=10.0, first=10.5, finished=12.5),  # ttft 0.5, tpot 2/4 = 0.5, e2e 2.5
        _output(1, arrival=10.0, first=11.0, finished=11.0),  # ttft 1.0, no tpot, e2e 1.0
        _output(3, arrival=11.0, first=11.5, finished=12.0),  # ttft 0.5, tpot 0.5/2 = 0.25, e2e 1.0
    ]
    s = metrics.summarize(outs)
    assert s["num_requests"] == 3 and s["output_tokens"] == 9
    assert s["wall_s"] == pytest.approx(2.5)  # first arrival 10.0 to last finish 12.5
    assert s["output_tok_s"] == pytest.approx(9 / 2.5)
    assert s["ttft_p50_s"] == pytest.approx(0.5)
    assert s["ttft_mean_s"] == pytest.approx(2 / 3)
    assert s["ttft_p99_s"] == pytest.approx(0.5 + 0.98 * 0.5)  # between the 2nd and 3rd sorted values
    assert s["tpot_p50_s"] == pytest.approx(0.375) and s["tpot_mean_s"] == pytest.approx(0.375)
    assert s["e2e_p50_s"] == pytest.approx(1.0) and s["e2e_mean_s"] == pytest.approx(4.5 / 3)
    assert metrics.summarize(outs, wall_time_s=3.0)["output_tok_s"] == pytest.approx(3.0)
    assert metrics.summarize(outs[1:2])["tpot_p50_s"] is None


def test_timers():
    with metrics.Timer() as t:
        sum(range(1000))
    assert t.elapsed_s > 0
    ms = metrics.cuda_time_ms(lambda: sum(range(1000)), warmup=1, repeats=4, device="cpu")
    assert len(ms) == 4 and all(m > 0 for m in ms)


def test_format_table_and_save_json(tmp_path):
    rows = [{"engine": "naive", "tok_s": 26.8}, {"engine": "minivllm", "tok_s": 12345.6, "ttft_s": 0.0123}]
    lines = metrics.format_table(rows, ["engine", "tok_s", "ttft_s"]).splitlines()
    assert lines[0].split() == ["engine", "tok_s", "ttft_s"]
    assert lines[2].split() == ["naive", "26.80", "-"] and lines[3].split() == ["minivllm", "12,346", "0.0123"]
    assert len({len(line) for line in lines[:2]}) == 1
    path = metrics.save_json(tmp_path / "a" / "b.json", {"tok_s": np.float64(1.5), "n": np.int64(3)})
    data = json.loads(path.read_text())
    assert data == {"hardware": metrics.hardware_name(), "tok_s": 1.5, "n": 3}


def test_format_seconds_never_says_zero():
    assert [metrics.format_seconds(s) for s in (12.34, 0.4, 0.1, 0.0949, 0.035, 0.001, 0.0004, 0.0)] == \
        ["12.3 s", "0.4 s", "0.1 s", "95 ms", "35 ms", "1 ms", "<1 ms", "<1 ms"]


# --- roofline ----------------------------------------------------------------------------------


def test_mistral_bytes():
    assert roofline.weight_bytes(MISTRAL_7B) == pytest.approx(14.48e9, rel=0.01)
    assert roofline.kv_bytes_per_token(MISTRAL_7B) == 131072


def test_batch1_decode_limit():
    assert roofline.roofline_tok_s(MISTRAL_7B, 1, 1, H200_BW, H200_FLOPS) == pytest.approx(296, rel=0.02)
    # Batching shares the weight reads: far more tokens per second, until compute takes over.
    assert roofline.roofline_tok_s(MISTRAL_7B, 64, 200, H200_BW, H200_FLOPS) > 50 * 296


def test_workload_roofline_near_design_numbers():
    def bound(w, **kw):
        return roofline.workload_roofline_tok_s(
            MISTRAL_7B, [len(p) for p in w.prompts], w.max_tokens, H200_BW, H200_FLOPS, **kw
        )

    assert bound(workloads.w1(32000)) == pytest.approx(12400, rel=0.03)
    assert bound(workloads.w2(32000)) == pytest.approx(13900, rel=0.03)
    assert bound(workloads.w1(32000), max_batch=8) < bound(workloads.w1(32000))


def test_kv_capacity_gqa_vs_mha_on_a10():
    mha = replace(MISTRAL_7B, num_kv_heads=32)
    mha_seqs = roofline.kv_cache_capacity_tokens(mha, roofline.A10_MEMORY_BYTES) / 4096
    gqa_seqs = roofline.kv_cache_capacity_tokens(MISTRAL_7B, roofline.A10_MEMORY_BYTES) / 4096
    assert 4 <= mha_seqs <= 5.5
    assert 4 <= gqa_seqs / mha_seqs <= 5  # 4x smaller cache per token, and smaller weights too
    assert roofline.max_batch_size(MISTRAL_7B, roofline.A10_MEMORY_BYTES, 4096) == int(gqa_seqs)
    assert roofline.kv_cache_capacity_tokens(MISTRAL_7B, 10e9) == 0  # weights alone don't fit


def test_from_config_engine_and_hf_names():
    engine_cfg = SimpleNamespace(**{f: getattr(MISTRAL_7B, f) for f in MISTRAL_7B.__dataclass_fields__})
    assert roofline.ModelShape.from_config(engine_cfg) == MISTRAL_7B
    hf_cfg = SimpleNamespace(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=32000, tie_word_embeddings=False,
    )
    assert roofline.ModelShape.from_config(hf_cfg) == MISTRAL_7B


def test_measurements_run_on_cpu():
    assert roofline.measure_bandwidth_Bps("cpu", nbytes=2**20, warmup=1, repeats=3) > 0
    assert roofline.measure_matmul_flops("cpu", n=64, warmup=1, repeats=3) > 0


def test_kernel_bench_runs_every_kernel_and_its_reference(tmp_path):
    import torch

    from minivllm_lab.bench.kernels import plot_kernel_bench, run_kernel_bench
    result = run_kernel_bench(device="cpu", dtype=torch.float32, smoke=True)
    kernels = {row["kernel"] for row in result["rows"]}
    # a sweep each
    assert len(kernels) == 6 and all(sum(r["kernel"] == k for r in result["rows"]) >= 2 for k in kernels)
    assert all(row["triton_ms"] > 0 and row["torch_ms"] > 0 for row in result["rows"])
    assert all("triton_TFLOPs" in row for row in result["rows"] if row["kernel"] == "prefill attention")
    assert Path(plot_kernel_bench(result, str(tmp_path / "kernels.png"))).stat().st_size > 0


def test_decode_step_times_cover_the_whole_batch(tiny_llama):
    # 6 prompts of 20 tokens with a 32-token step budget: the prefill takes several steps, and the
    # first sequences decode meanwhile. Every timed step must still be a decode of all 6.
    from minivllm import LLM
    from minivllm_lab.bench.profile import decode_step_times_ms
    llm = LLM(tiny_llama[0], max_model_len=64, max_num_batched_tokens=32, num_kv_blocks=64)
    engine = llm.llm_engine
    steps_seen = []
    run = engine.runner.execute_model
    engine.runner.execute_model = lambda out: steps_seen.append(out.num_new_tokens) or run(out)
    times = decode_step_times_ms(llm, batch=6, context=20, steps=3)
    assert len(times) == 3
    assert steps_seen[-3:] == [[1] * 6] * 3
    assert not engine.has_unfinished_requests()
    assert engine.get_stats()["num_free_blocks"] == engine.get_stats()["num_total_blocks"]


def test_decode_step_times_refuse_a_batch_that_shrank(tiny_llama):
    # 20-token prompts in a 24-token model: 4 tokens each, fewer than the warm-up and 5 timed steps.
    from minivllm import LLM
    from minivllm_lab.bench.profile import decode_step_times_ms
    llm = LLM(tiny_llama[0], max_model_len=24, num_kv_blocks=16)
    with pytest.raises(RuntimeError, match="max_model_len"):
        decode_step_times_ms(llm, batch=2, context=20, steps=5)
    stats = llm.llm_engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_launch_count_counts_the_operations_of_a_call():
    import torch

    from minivllm_lab.bench.profile import launch_count
    x = torch.randn(8, 8)
    one, three = launch_count(lambda: x @ x), launch_count(lambda: ((x @ x) @ x) @ x)
    assert one["gpu_kernels"] is None and one["host_to_device_copies"] == 0   # (on a CPU)
    assert dict(three["top_ops"])["mm"] == 3 * dict(one["top_ops"])["mm"] == 3


def test_decode_step_profile_time_without_kernels_is_never_negative(monkeypatch):
    # A step in which the GPU never idles: the profiled steps' kernels (1.03 ms a step) a little above the bare
    # steps' median wall time (1 ms), as the torch reference's step came out on an H200 (227 ms against 224).
    import torch

    from minivllm_lab.bench import profile
    kernel = SimpleNamespace(key="gemm", count=2, device_type=torch.autograd.DeviceType.CUDA,
                             self_device_time_total=2 * 1030.0)

    class Profiler:
        def __init__(self, **_):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *_):
            return False

        def key_averages(self):
            return [kernel]

    monkeypatch.setattr(profile, "decode_step_times_ms", lambda *args, **kw: [1.0] * 10)
    monkeypatch.setattr(profile, "_start_decoding", lambda engine, batch, context: [])
    monkeypatch.setattr(profile, "_stop", lambda engine, seqs: None)
    monkeypatch.setattr(profile.torch.profiler, "profile", Profiler)
    llm = SimpleNamespace(llm_engine=SimpleNamespace(step=lambda: None))
    p = profile.decode_step_profile(llm, batch=1, context=8, steps=2)
    assert p["gpu_ms"] == pytest.approx(1.03) and p["wall_ms"] == 1.0
    assert p["overhead_ms"] == 0 and p["overhead_fraction"] == 0


def test_mixed_step_bench_times_the_steps_it_names(tmp_path):
    # --smoke on a CPU: the two engines run, and the timed steps carried exactly the decodes and the chunk asked for.
    from minivllm_lab.bench import mixed_step
    result = mixed_step.main(["--smoke", "--out", str(tmp_path / "mixed.json")])
    sizes = mixed_step.SMOKE_SIZES
    for engine in ("graphed", "eager"):
        assert result[engine]["mixed_steps"] == [(sizes["decodes"], sizes["chunk"])]
        assert result[engine]["decode_steps"] == [(sizes["decodes"], 0)]
        assert len(result[engine]["mixed_ms_runs"]) == sizes["runs"]
    assert result["chunk_matmul_tflop"] > 0 and "floor_ms" not in result  # no GPU: no measured rate, no floor
    assert (tmp_path / "mixed.json").is_file()
