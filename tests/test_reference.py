"""The committed run beside the reader's (minivllm_lab.reference), on a temporary figures folder:
a file that is there, one that is fetched, and one that can be had neither way (offline)."""
from __future__ import annotations

import json

from minivllm_lab.reference import load_reference, pick, raw_url

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
    assert "yours (CPU (2 cores))" in header and "committed (NVIDIA H200)" in header
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
    assert "yours (CPU (2 cores))" in header and "committed (NVIDIA H200)" in header
    assert b.split() == ["b", "5.0", "1,000.0"] and a.split() == ["a", "n/a", "10.0"]


def test_readings_print_both_runs_under_their_hardware(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"hardware": "NVIDIA H200", "tok_s": 8000.0}))
    committed = load_reference("x", figures=tmp_path)
    sentences = lambda run: [f"{run['tok_s']:,.0f} tok/s"]  # noqa: E731
    text = committed.readings({"hardware": "CPU", "tok_s": 10.0}, sentences, describe=lambda run: "W1")
    assert text == "your run, on CPU, W1:\n- 10 tok/s\n\nthe committed run, on NVIDIA H200, W1:\n- 8,000 tok/s"
    missing = load_reference("y", figures=tmp_path, url="http://127.0.0.1:9/none.json", timeout_s=0.5)
    assert missing.readings({"hardware": "CPU", "tok_s": 1.0}, sentences).endswith(f"not available ({missing.where})")
