"""The benchmark CLI runs every engine end to end (smoke sizes, CPU) and writes its JSON."""
import json

from minivllm.bench.__main__ import ENGINES, main


def test_cli_runs_every_engine(tiny_llama, tmp_path, capsys):
    out = tmp_path / "bench.json"
    main(["--smoke", "--model", tiny_llama[0], "--out", str(out)])
    result = json.loads(out.read_text())
    assert len(result["rows"]) == len(ENGINES)
    assert all(row["output_tokens"] > 0 and row["output_tok_s"] > 0 for row in result["rows"])
    assert result["decode"]["batch1"]["ms_per_token"] > 0
    assert "minivllm" in capsys.readouterr().out
