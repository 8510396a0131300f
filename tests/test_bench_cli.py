"""The benchmark CLI runs every engine and the ablation end to end (smoke sizes, CPU) and
writes its JSON and plot; a failed engine makes it exit non-zero, after saving what it measured."""
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from minivllm_lab.bench import runners
from minivllm_lab.bench.__main__ import ABLATION, ENGINES, main, make_workloads, parse_args


@pytest.mark.extended  # every engine and ablation row, about 40 s; test_cli_runs_w1_w2_and_w3_offline is short
def test_cli_runs_every_engine_and_the_ablation(tiny_llama, tmp_path, capsys):
    out = tmp_path / "bench.json"
    main(["--smoke", "--ablation", "--model", tiny_llama[0], "--out", str(out)])
    result = json.loads(out.read_text())
    assert not [row for row in result["rows"] if "error" in row]
    assert len(result["rows"]) == len(ENGINES) + len(ABLATION)
    assert all(row["output_tokens"] > 0 and row["output_tok_s"] > 0 for row in result["rows"])
    assert {f"minivllm, {label}" for label in ABLATION} <= {row["engine"] for row in result["rows"]}
    assert result["decode"]["batch1"]["ms_per_token"] > 0
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert "minivllm" in capsys.readouterr().out


def test_a_failed_engine_exits_non_zero_after_saving_the_rest(tiny_llama, tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("engine broke")
    monkeypatch.setattr(runners, "run_minivllm", broken)
    out = tmp_path / "bench.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["--smoke", "--no-decode", "--engines", "minivllm,hf-static", "--model", tiny_llama[0], "--out", str(out)])
    assert exit_info.value.code == 1
    rows = json.loads(out.read_text())["rows"]
    assert rows[0] == {"engine": "minivllm", "workload": "W1", "error": "RuntimeError: engine broke"}
    assert rows[1]["engine"] == "transformers static batch" and rows[1]["output_tok_s"] > 0
    assert "minivllm on W1" in capsys.readouterr().err


def test_results_go_to_bench_results_in_the_current_directory(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["--smoke", "--no-decode", "--engines", "minivllm", "--model", tiny_llama[0]])
    assert sorted(p.name for p in (tmp_path / "bench-results").iterdir()) == ["smoke_bench_w1.json",
                                                                             "smoke_bench_w1.png"]
    assert not (tmp_path / "figures").exists()


def test_default_model_follows_the_device(monkeypatch):
    monkeypatch.delenv("MINIVLLM_MODEL", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parse_args([]).model == "smollm2-135m"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for gib, model in ((141, "mistral-7b"), (16, "llama-3.2-1b")):  # an H200; a T4
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda _, gib=gib: SimpleNamespace(total_memory=gib * 2**30))
        assert parse_args([]).model == model
    assert parse_args(["--model", "my-folder"]).model == "my-folder"


def test_w3_offline_is_every_w3_request_at_once():
    full, smoke = make_workloads(["w3-offline"], 32000, smoke=False)[0], make_workloads(["w3-offline"], 32000, True)[0]
    assert (full.name, len(full.prompts), full.num_output_tokens) == ("W3-offline", 1000, 150_000)
    assert (smoke.name, len(smoke.prompts)) == ("W3-offline", 4)
    assert len({tuple(p[:8]) for p in smoke.prompts}) == 1  # the shared system prompt


def test_cli_runs_w1_w2_and_w3_offline(tiny_llama, tmp_path, capsys):
    out = tmp_path / "bench.json"
    main(["--smoke", "--workload", "w1,w2,w3-offline", "--engines", "minivllm,hf-static", "--model", tiny_llama[0],
          "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["workloads"] == ["W1", "W2", "W3-offline"]
    # hf-static generates one length for every request: it skips W2, whose lengths differ.
    assert [(row["engine"], row["workload"]) for row in result["rows"]] == [
        ("minivllm", "W1"), ("minivllm", "W2"), ("minivllm", "W3-offline"),
        ("transformers static batch", "W1"), ("transformers static batch", "W3-offline")]
    assert "W2: skipping hf-static" in capsys.readouterr().out


def test_without_the_bench_extra_the_error_says_what_to_install():
    # As if matplotlib, httpx and jsonschema were not installed: each command's --help (and an import of the
    # serving plot) names the extra, not only the missing module.
    modules = ["minivllm_lab.bench", "minivllm_lab.bench.serve", "minivllm_lab.bench.serve_overhead",
               "minivllm_lab.bench.serve_plot"]
    script = f"""
import runpy, sys
for name in ("matplotlib", "httpx", "jsonschema"):
    sys.modules[name] = None
for module in {modules!r}:
    sys.argv = [module, "--help"]
    try:
        runpy.run_module(module, run_name="__main__")
    except ModuleNotFoundError as e:
        print(module, "->", e)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    lines = run.stdout.splitlines()
    assert [line.split(" -> ")[0] for line in lines] == modules, run.stdout + run.stderr
    assert all("pip install -e '.[bench]'" in line for line in lines), run.stdout
