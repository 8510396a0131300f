"""No warning in a committed notebook's outputs: a warning that reaches a reader's screen is silenced where it comes
from (the package) or fixed, never left in the outputs. Warnings go to stderr, so a cell's stderr holds nothing but
the package's one-time notices. Also no "(s)"-style plurals: counts print as words."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
WARNING_LINE = re.compile(r"\b\w*Warning\b|\bWARNING\b|^\s*warnings\.warn")
ODD_PLURAL = re.compile(r"(?<![\w.])(?!len\()[A-Za-z]+\((?:s|es)\)")  # "prompt(s)", not the call "len(s)"
STDERR_NOTICES = ("building SmolLM2-135M folder from GGUF",)  # the package's own one-time notice


def output_lines(path: Path):
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            for line in text.splitlines():
                yield index, out.get("name") == "stderr", line


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem[:2] for p in NOTEBOOKS])
def test_no_warning_or_odd_plural_in_the_outputs(path):
    bad = [f"cell {i}: {line.strip()[:120]}" for i, stderr, line in output_lines(path)
           if WARNING_LINE.search(line) or ODD_PLURAL.search(line)
           or (stderr and line.strip() and not line.startswith(STDERR_NOTICES))]
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_warning_and_an_odd_plural():
    assert WARNING_LINE.search("/x/y.py:3: UserWarning: CUDA is not available")
    assert WARNING_LINE.search("WARNING 12-05 engine: something")
    assert ODD_PLURAL.search("1 graph launch(es)") and ODD_PLURAL.search("2 prompt(s)")
    assert not WARNING_LINE.search("prefix caching: off (a sliding window)")
    assert not ODD_PLURAL.search("lens = [len(s) for s in seqs]")
