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
# Issues 30 (the engine in vLLM v1's shape), 31 (mixed steps graphed, defaults by device) and 33 (the course's
# fourth edition) changed code cells of these notebooks, and added cells (never run), after their run at 6d8175d
# (an H200). The series was re-executed from one commit, 6a0713e, on an H100, except these two: the session's
# device time ran out. strict: once they are re-run at the series' commit, (b), (c) and (d) pass for them, pytest
# reports that as a failure, and whoever re-ran them empties these sets.
NEEDS_RE_RUN = pytest.mark.xfail(strict=True, raises=AssertionError,
                                 reason="code cells changed by issues 30, 31, 33 after the run: re-execute it at the "
                                 "series' commit, then remove this mark")
EDITED_SINCE_THE_RUN = {"14", "15"}
CELLS_ADDED_SINCE_THE_RUN = EDITED_SINCE_THE_RUN
FIGURES_NOT_MADE_YET: set[str] = set()  # figures these notebooks save now, made when they re-run
RAN_BEFORE_THE_RE_RUN = EDITED_SINCE_THE_RUN  # their outputs are still those of the run at 6d8175d


def marked(expected_to_fail: set[str]):
    def marks(p):
        return NEEDS_RE_RUN if p.stem[:2] in expected_to_fail else ()
    return pytest.mark.parametrize("path", [pytest.param(p, marks=marks(p)) for p in NOTEBOOKS],
                                   ids=[p.stem[:2] for p in NOTEBOOKS])


each_notebook = marked(set())
each_notebook_edited_expected_to_fail = marked(EDITED_SINCE_THE_RUN)


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


def re_run_commits() -> dict[str, str]:
    return {path.name: env_of(path)["commit"] for path in NOTEBOOKS
            if path.stem[:2] not in RAN_BEFORE_THE_RE_RUN}


def test_all_notebooks_ran_at_one_commit():  # (b)
    commits = re_run_commits()
    assert len(set(commits.values())) == 1, commits


@marked(RAN_BEFORE_THE_RE_RUN)
def test_a_notebook_ran_at_the_re_runs_commit(path):  # (b), notebook by notebook
    assert env_of(path)["commit"] in set(re_run_commits().values()), path.name


@each_notebook_edited_expected_to_fail
def test_no_cell_was_edited_after_the_run(path):  # (c)
    in_a_checkout()
    commit = env_of(path)["commit"]
    if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        pytest.skip(f"{path.name} ran at commit {commit}, which this clone's history does not have (a shallow clone?)")
    then = git("show", f"{commit}:notebooks/{path.name}")
    assert then.returncode == 0, f"{path.name} ran at {commit}, where it was not committed"
    assert code_cell_sources(then.stdout) == code_cell_sources(path.read_text()), (
        f"{path.name}: code cells differ from those of commit {commit}, which the outputs come from")


@marked(CELLS_ADDED_SINCE_THE_RUN)
def test_every_cell_ran_once_in_order(path):  # (d)
    cells = json.loads(path.read_text())["cells"]
    counts = [cell["execution_count"] for cell in cells if cell["cell_type"] == "code"]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: a cell re-run by hand, or not run"


# A figure a notebook saves: a literal file name joined to figures_dir() (or FIGURES, its value), as in
# `figures_dir() / "05_pool.png"`. Names built at run time (f-strings with {...}) are not matched.
SAVED = re.compile(r"""(?:figures_dir\(\)|FIGURES)\s*/\s*["'](\d\d_[^"'{}]+\.\w+)["']""")


@marked(FIGURES_NOT_MADE_YET)
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
