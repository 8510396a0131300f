"""The committed notebooks' outputs come from one run of the series, of code that is in git.

Every executed notebook prints one line `minivllm-env: {json}` (minivllm_lab.notebook.setup) naming the
commit it ran at. From that line and git this checks that:

(a) every notebook 00..17 has the line, once;
(b) all of them name the same commit: the series was run as one;
(c) at that commit the notebook's code cells were what they are now: no cell edited after the run;
(d) the cells ran once each, in order (execution counts 1, 2, ..., N): none re-run by hand, none skipped;
(e) every figure file a notebook saves is tracked in figures/;
(f) no notebook ran on a checkout with uncommitted changes (older lines have no "dirty" field: unknown,
    accepted).

Outputs that fail (b) or (c) may be right, but nobody can say which code made them. The fix is to
re-execute the whole series from one commit (scripts/gpu_notebooks.sh), never to edit an output.
"""
import json
import re
import subprocess
from pathlib import Path

import pytest

from minivllm_lab.notebook import code_cell_sources

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ENV_PREFIX = "minivllm-env: "
each_notebook = pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem[:2] for p in NOTEBOOKS])


def git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)


def env_lines(path: Path) -> list[dict]:
    """The fields of every minivllm-env line in the notebook's outputs."""
    cells = json.loads(path.read_text())["cells"]
    texts = ["".join(out.get("text", "")) for cell in cells if cell["cell_type"] == "code" for out in cell["outputs"]]
    return [json.loads(line.removeprefix(ENV_PREFIX)) for text in texts for line in text.splitlines()
            if line.startswith(ENV_PREFIX)]


def env_of(path: Path) -> dict:
    lines = env_lines(path)
    assert len(lines) == 1, f"{path.name}: {len(lines)} minivllm-env lines"
    return lines[0]


def in_a_checkout():
    if git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")


def test_the_series_is_00_to_17():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(18)]


@each_notebook
def test_a_notebook_says_once_what_ran_it(path):  # (a)
    assert env_of(path)["commit"], f"{path.name} does not name its commit"


def test_all_notebooks_ran_at_one_commit():  # (b)
    commits = {path.name: env_of(path)["commit"] for path in NOTEBOOKS}
    assert len(set(commits.values())) == 1, commits


# Notebooks whose code cells changed since the series ran (13: its load test first streams every request at once
# and counts the rates asking for more tokens a second as broken; 14: its summary table names where the split
# ran; 16: W1's cost of a schema reads as a longer run, and the parallel-sampling timing warms up first; 00, 01,
# 03, 04, 06, 11, 12: warm-ups, formats and comments of their exercises and prints): expected to fail (c) until
# the series is re-executed, and to fail loudly if they pass.
EDITED_SINCE_THE_RUN = {"00", "01", "03", "04", "06", "11", "12", "13", "14", "16"}


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="edited since the run: re-execute the series"))
    if p.stem[:2] in EDITED_SINCE_THE_RUN else p for p in NOTEBOOKS], ids=[p.stem[:2] for p in NOTEBOOKS])
def test_no_cell_was_edited_after_the_run(path):  # (c)
    in_a_checkout()
    commit = env_of(path)["commit"]
    if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        pytest.skip(f"{path.name} ran at commit {commit}, which this clone's history does not have (a shallow clone?)")
    then = git("show", f"{commit}:notebooks/{path.name}")
    assert then.returncode == 0, f"{path.name} ran at {commit}, where it was not committed"
    assert code_cell_sources(then.stdout) == code_cell_sources(path.read_text()), (
        f"{path.name}: code cells differ from those of commit {commit}, which the outputs come from")


@each_notebook
def test_every_cell_ran_once_in_order(path):  # (d)
    cells = json.loads(path.read_text())["cells"]
    counts = [cell["execution_count"] for cell in cells if cell["cell_type"] == "code"]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: a cell re-run by hand, or not run"


# A figure a notebook saves: a literal file name joined to figures_dir() (or FIGURES, its value), as in
# `figures_dir() / "05_pool.png"`. Names built at run time (f-strings with {...}) are not matched.
SAVED = re.compile(r"""(?:figures_dir\(\)|FIGURES)\s*/\s*["'](\d\d_[^"'{}]+\.\w+)["']""")


@each_notebook
def test_every_saved_figure_is_tracked(path):  # (e)
    in_a_checkout()
    saved = {name for code in code_cell_sources(path.read_text()) for name in SAVED.findall(code)}
    assert saved, f"{path.name} saves no figure that this test can see: is SAVED still right?"
    tracked = set(git("ls-files", "figures").stdout.split())
    assert sorted(name for name in saved if f"figures/{name}" not in tracked) == [], path.name


@each_notebook
def test_no_notebook_ran_on_a_dirty_tree(path):  # (f)
    assert env_of(path).get("dirty") is not True, (
        f"{path.name} ran with uncommitted changes: its commit does not name the code that ran")
