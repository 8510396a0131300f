"""The scoreboard (minivllm_lab.scoreboard) in a temporary folder: a step added, added again on the same
hardware (it replaces), on other hardware (it joins), the chart drawn; and the committed bars."""
from __future__ import annotations

import json
from pathlib import Path

from minivllm_lab import scoreboard

FIGURES = Path(__file__).resolve().parent.parent / "figures"


def test_add_overwrite_and_draw(tmp_path, monkeypatch):
    # A new scoreboard starts from the committed one; here, from none.
    monkeypatch.setattr("minivllm_lab.reference.REPO_ROOT", tmp_path / "no-clone")
    monkeypatch.setattr("minivllm_lab.reference.raw_url", lambda name: None)
    path = tmp_path / "scoreboard.json"
    png = scoreboard.add("06 minivllm, continuous batching (paged KV)", 100.0, "CPU (2 cores)", path=path)
    assert png == tmp_path / "scoreboard.png" and png.stat().st_size > 0
    scoreboard.add("00 transformers, one request at a time", 2.5, "CPU (2 cores)", path=path)
    scoreboard.add("06 minivllm, continuous batching (paged KV)", 120.0, "CPU (2 cores)", source="run 2", path=path)
    scoreboard.add("06 minivllm, continuous batching (paged KV)", 8763.5, "NVIDIA H200", path=path,
                   source="figures/06_continuous_batching.json: a committed bar")  # drawn first in its row
    entries = json.loads(path.read_text())["entries"]
    assert [(e["step"][:2], e["hardware"], e["tok_s"]) for e in entries] == [
        ("00", "CPU (2 cores)", 2.5), ("06", "NVIDIA H200", 8763.5), ("06", "CPU (2 cores)", 120.0)]
    assert entries[2]["source"] == "run 2"  # the second number replaced the first


def test_a_new_scoreboard_starts_from_the_committed_one(tmp_path):
    path = tmp_path / "scoreboard.json"
    scoreboard.add("06 minivllm, continuous batching (paged KV)", 50.0, "CPU (2 cores)", path=path, draw_png=False)
    entries = json.loads(path.read_text())["entries"]
    assert any(e["hardware"].startswith("NVIDIA ") and e["source"].startswith("figures/") for e in entries)
    assert any(e["hardware"] == "CPU (2 cores)" for e in entries)


def test_the_committed_bars_are_the_committed_json():
    committed = json.loads((FIGURES / "scoreboard.json").read_text())["entries"]
    rebuilt = scoreboard.committed_entries(FIGURES)
    assert [(e["step"], e["hardware"], e["tok_s"]) for e in committed] == [
        (e["step"], e["hardware"], e["tok_s"]) for e in rebuilt]
    by_step = {e["step"]: e for e in rebuilt}
    one_at_a_time = by_step["00 transformers, one request at a time"]["tok_s"]
    assert by_step["12+ the whole engine (every step on)"]["tok_s"] > 100 * one_at_a_time
    assert all(e["source"].startswith("figures/") for e in rebuilt)


def test_a_file_not_from_a_gpu_gives_no_bar_and_a_gpu_file_its_own_hardware(tmp_path):
    (tmp_path / "00_baseline.json").write_text(json.dumps({"hardware": "CPU", "summary": {"output_tok_s": 3.0}}))
    assert scoreboard.committed_entries(tmp_path) == []
    (tmp_path / "00_baseline.json").write_text(json.dumps({"hardware": "NVIDIA H100 80GB HBM3",
                                                            "summary": {"output_tok_s": 15.0}}))
    assert [(e["hardware"], e["tok_s"]) for e in scoreboard.committed_entries(tmp_path)] == [
        ("NVIDIA H100 80GB HBM3", 15.0)]


def test_a_notebooks_own_w1_run_wins_over_the_bench(tmp_path):
    off, whole = "12 whole engine but no CPU/GPU overlap", "12+ the whole engine (every step on)"
    bench = {"hardware": "NVIDIA H200", "rows": [
        {"engine": "minivllm", "output_tok_s": 9000.0},
        {"engine": "minivllm, no overlap (async_scheduling=False)", "output_tok_s": 7000.0}]}
    (tmp_path / "bench_w1.json").write_text(json.dumps(bench))
    before = {e["step"]: e for e in scoreboard.committed_entries(tmp_path)}
    assert (before[off]["tok_s"], before[whole]["tok_s"]) == (7000.0, 9000.0)
    own = {"hardware": "NVIDIA H200", "scoreboard_w1": [{"engine": off, "output_tok_s": 7100.0},
                                                        {"engine": whole, "output_tok_s": 8900.0}]}
    (tmp_path / "12_overlap.json").write_text(json.dumps(own))
    after = {e["step"]: e for e in scoreboard.committed_entries(tmp_path)}
    assert (after[off]["tok_s"], after[whole]["tok_s"]) == (7100.0, 8900.0)
    assert after[whole]["source"].startswith("figures/12_overlap.json")


def test_measure_switch_runs_w1_off_and_on_and_adds_the_steps_bar(tmp_path, monkeypatch):
    # Notebooks 10 and 11 call it on a GPU; the same code on a CPU, with a tiny model and a small W1.
    from types import SimpleNamespace

    from minivllm.models.loader import resolve_model
    from minivllm_lab.bench.workloads import w1
    from minivllm_lab.notebook import tiny_checkpoint

    monkeypatch.setenv("MINIVLLM_FIGURES", str(tmp_path))
    (tmp_path / "11_cuda_graphs.json").write_text(json.dumps({"hardware": "CPU (test)", "engines": {}}))
    model = tiny_checkpoint(num_layers=2)
    env = SimpleNamespace(model=model, hardware="CPU (test)", label="tiny",
                          engine_args=lambda **o: dict(device="cpu", dtype="float32", num_kv_blocks=32) | o)
    work = w1(resolve_model(model).config.vocab_size, num_requests=3, max_prompt=16, output_len=4)
    step = "11 whole engine but eager (no CUDA graphs)"
    (off, whole), chart = scoreboard.measure_switch(env, step, dict(enforce_eager=True), "11_cuda_graphs.json", work)
    assert (off["engine"], whole["engine"]) == (step, "the whole engine")
    assert off["output_tokens"] == whole["output_tokens"] == 3 * 4
    saved = json.loads((tmp_path / "11_cuda_graphs.json").read_text())
    assert saved["engines"] == {} and [r["engine"] for r in saved["scoreboard_w1"]] == [step, "the whole engine"]
    entries = json.loads((tmp_path / "scoreboard.json").read_text())["entries"]
    mine = [e for e in entries if e["hardware"] == "CPU (test)"]
    assert [(e["step"], e["tok_s"]) for e in mine] == [(step, off["output_tok_s"])]
    assert chart.exists()
