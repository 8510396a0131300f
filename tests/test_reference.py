"""The committed run beside the reader's (minivllm_lab.reference), on a temporary figures folder:
a file that is there, one that is fetched, one that can be had neither way (offline), and the committed run
itself, which has no other run beside it."""
from __future__ import annotations

import json

from minivllm_lab.reference import load_reference, pick, raw_url, readings

RUN = {"hardware": "NVIDIA H200", "summary": {"output_tok_s": 17.699}, "rows": [{"tok_s": 8763.45}]}


def test_a_committed_file_is_read_with_its_hardware(tmp_path):
    (tmp_path / "00_baseline.json").write_text(json.dumps(RUN))
    ref = load_reference("00_baseline", figures=tmp_path, url="http://127.0.0.1:9/never-asked.json")
    assert ref.found and ref.hardware == "NVIDIA H200"
    assert ref.value("summary.output_tok_s") == 17.699
    assert ref.value("rows.0.tok_s") == 8763.45
    assert ref.value(lambda d: d["rows"][0]["tok_s"] / 2) == 8763.45 / 2
    assert ref.value("summary.missing") is None and ref.fmt("rows.5.tok_s") == "n/a"
    table = ref.table([("output tok/s", 4.25, "summary.output_tok_s"),
                       ("share", 0.5, lambda d: d["summary"]["output_tok_s"] / 177, ".0%")], yours="CPU (2 cores)")
    header, row, share = table.splitlines()
    assert "this run (CPU (2 cores))" in header and "committed run (NVIDIA H200)" in header
    assert row.split() == ["output", "tok/s", "4.2", "17.7"]
    assert share.split() == ["share", "50%", "10%"]


def test_a_missing_file_is_fetched_from_the_url(tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "06_x.json").write_text(json.dumps(RUN))
    ref = load_reference("06_x", figures=tmp_path / "clone", url=(remote / "06_x.json").as_uri())
    assert ref.found and ref.where.startswith("file:") and ref.fmt("summary.output_tok_s") == "17.7"


def test_offline_says_so_and_never_raises(tmp_path):
    ref = load_reference("06_x", figures=tmp_path, url="http://127.0.0.1:9/06_x.json", timeout_s=1)
    assert not ref.found and "offline" in ref.where
    assert ref.value("summary.output_tok_s") is None and ref.fmt("summary.output_tok_s") == "n/a"
    table = ref.table([("output tok/s", 4.25, "summary.output_tok_s")], yours="CPU")
    assert "n/a" in table and "no committed numbers" in table and "offline" in table


def test_a_file_without_a_hardware_field_says_so(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"rows": []}))
    assert "hardware not recorded" in load_reference("a", figures=tmp_path).hardware


def test_the_raw_url_comes_from_the_repository_url():
    assert raw_url("06_x", "https://github.com/owner/repo") == \
        "https://raw.githubusercontent.com/owner/repo/main/figures/06_x.json"
    assert raw_url("06_x").endswith("/main/figures/06_x.json")  # pyproject.toml's [project.urls] Repository


def test_beside_looks_up_the_same_keys_in_both_runs(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"hardware": "NVIDIA H200", "rows": [
        {"engine": "a", "tok_s": 10.0}, {"engine": "b", "tok_s": 1000.0}]}))
    ref = load_reference("r", figures=tmp_path)
    mine = {"hardware": "CPU (2 cores)", "rows": [{"engine": "b", "tok_s": 5.0}]}  # fewer rows, another order
    text = ref.beside(mine, [("b", pick("rows", "tok_s", engine="b")), ("a", pick("rows", "tok_s", engine="a"))])
    header, b, a = text.splitlines()
    assert "this run (CPU (2 cores))" in header and "committed run (NVIDIA H200)" in header
    assert b.split() == ["b", "5.0", "1,000.0"] and a.split() == ["a", "n/a", "10.0"]


def test_readings_print_this_run_under_its_hardware():
    sentences = lambda run: [f"{run['tok_s']:,.0f} tok/s"]  # noqa: E731
    text = readings({"hardware": "CPU", "tok_s": 10.0}, sentences, describe=lambda run: "W1")
    assert text == "this run, on CPU, W1:\n- 10 tok/s"


def test_the_committed_run_itself_prints_one_column(tmp_path, monkeypatch):
    (tmp_path / "r.json").write_text(json.dumps({"hardware": "NVIDIA H200", "tok_s": 8000.0}))
    monkeypatch.setenv("MINIVLLM_REFERENCE_RUN", "1")
    ref = load_reference("r", figures=tmp_path)  # the file is the older run's: this run is about to replace it
    assert not ref.found and ref.is_this_run and "this run is the committed run" in str(ref)
    header, row = ref.beside({"hardware": "NVIDIA H200", "tok_s": 9000.0}, [("tok/s", "tok_s")]).splitlines()
    assert header.split() == ["metric", "this", "run", "(NVIDIA", "H200)"] and row.split() == ["tok/s", "9,000.0"]
    monkeypatch.setenv("MINIVLLM_REFERENCE_RUN", "0")
    assert load_reference("r", figures=tmp_path).fmt("tok_s") == "8,000.0"


def test_the_committed_run_still_reads_a_file_another_run_made(tmp_path, monkeypatch):
    (tmp_path / "serving_capacity_h200.json").write_text(json.dumps({"hardware": "NVIDIA H200", "capacity": 100}))
    monkeypatch.setenv("MINIVLLM_REFERENCE_RUN", "1")
    ref = load_reference("serving_capacity_h200", figures=tmp_path, written_by_this_run=False)
    assert ref.found and not ref.is_this_run and ref.value("capacity") == 100
    # named for what it is: not the notebook's committed run, which may have run on another GPU
    assert "the benchmark run on NVIDIA H200" in str(ref)
    assert "benchmark run (NVIDIA H200)" in ref.table([("x", 1.0, "capacity")], yours="NVIDIA H100").splitlines()[0]
    monkeypatch.setenv("MINIVLLM_REFERENCE_RUN", "0")
    missing = load_reference("gone", figures=tmp_path, url="http://127.0.0.1:9/gone.json", timeout_s=0.5)
    assert missing.table([("x", 1.0, "x")], yours="CPU").splitlines()[0].split() == [
        "metric", "this", "run", "(CPU)", "committed", "run", "(not", "available)"]
