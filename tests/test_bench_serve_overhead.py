"""The serving-overhead benchmark in smoke mode: offline, then the real server in each engine-core mode."""
import json

import pytest

from minivllm_lab.bench.serve_overhead import SMOKE, main


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_smoke_run_offline_and_served(mode, tmp_path, capsys):
    out = tmp_path / "serve_overhead.json"
    main(["--smoke", "--modes", mode, "--out", str(out), "--plot", str(tmp_path / "overhead.png")])
    result = json.loads(out.read_text())
    rows = {row["run"]: row for row in result["rows"]}
    assert list(rows) == ["offline", f"{mode} completions", f"{mode} chat"]
    expected_tokens = SMOKE["streams"] * SMOKE["output_len"]
    for row in rows.values():
        assert row["failed"] == 0 and row["output_tok_s"] > 0 and row["vs_offline"] > 0, row
        assert row["output_tokens"] == expected_tokens, row
    for name in (f"{mode} completions", f"{mode} chat"):
        row = rows[name]
        assert row["errors"] == [] and 1 <= row["tokens_per_chunk"] <= SMOKE["output_len"]
        if row["tokens_per_chunk"] < SMOKE["output_len"]:  # streamed in more than one chunk: gaps to time
            assert 0 < row["itl_p50_ms"] <= row["itl_p99_ms"]
        assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"]
    assert result["sizes"]["streams"] == SMOKE["streams"] and result["hardware"]
    assert result["command"][-1] == str(tmp_path / "overhead.png")
    assert (tmp_path / "overhead.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "vs_offline" in printed and f"{mode} chat" in printed
