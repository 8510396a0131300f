"""The benchmark CLI runs every engine and the ablation end to end (smoke sizes, CPU) and
writes its JSON and plot."""
import json

from minivllm.bench.__main__ import ABLATION, ENGINES, main


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
