"""The package source a notebook prints is the package's source now, not as it was when the notebook ran.

Notebooks show the engine's code with `print_source` (minivllm_lab/notebook.py), never with code pasted
into a cell. Each cell that calls it is run here, up to its last `print_source` call, and what it prints
must equal the cell's committed stdout. So a change to a printed function fails CI until the notebook
is re-executed, instead of leaving a notebook that teaches code the package no longer has.

No model loads: the cells only import and print.
"""
import ast
import json
import re
from pathlib import Path

import pytest

from minivllm_lab.notebook import print_source

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def code_cells():
    """(notebook path, cell index, cell) for every code cell of notebooks 00..."""
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code":
                yield path, index, cell


def calls_print_source(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print_source"
               for n in ast.walk(node))


# Cells whose printed source the package has changed since the series ran: expected to fail until the series is
# re-executed, and to fail loudly if they pass.
STALE_UNTIL_RE_RUN: set[str] = set()


def source_cell(path: Path, index: int):
    cell_id = f"{path.stem[:2]}-cell{index}"
    # Only a printout that differs is expected: a cell that raises (a marker gone from the source) still fails.
    stale = pytest.mark.xfail(strict=True, raises=AssertionError,
                              reason="the package changed what it prints: re-execute the notebook")
    return pytest.param(path, index, id=cell_id, marks=[stale] if cell_id in STALE_UNTIL_RE_RUN else [])


SOURCE_CELLS = [source_cell(path, index) for path, index, cell in code_cells()
                if "print_source(" in "".join(cell["source"])]


def printing_part(code: str) -> tuple[ast.Module, bool]:
    """The cell's statements up to its last print_source call, and whether any follow. Those that
    follow may use the notebook's earlier cells (a model, `env`): they are not run here."""
    body = ast.parse(code).body
    last = max(i for i, statement in enumerate(body) if calls_print_source(statement))
    return ast.Module(body=body[:last + 1], type_ignores=[]), last + 1 < len(body)


def committed_stdout(cell: dict) -> str:
    return "".join("".join(out["text"]) for out in cell["outputs"]
                   if out["output_type"] == "stream" and out["name"] == "stdout")


def test_the_notebooks_print_source_through_the_helper():
    assert len(SOURCE_CELLS) >= 40  # the parametrized test below must not pass by finding no cell
    pasted = [f"{path.name} cell {index}" for path, index, cell in code_cells()
              if re.search(r"print\(\s*inspect\.getsource", "".join(cell["source"]))]
    assert pasted == [], "print package source with minivllm_lab.notebook.print_source"


@pytest.mark.parametrize("path, index", SOURCE_CELLS)
def test_printed_source_is_current(path, index, capsys):
    cell = json.loads(path.read_text())["cells"][index]
    head, more_follows = printing_part("".join(cell["source"]))
    # A fresh namespace: the printing part must carry its own imports, as a reader's copy of the cell would.
    exec(compile(head, f"{path.name}, cell {index}", "exec"), {"__name__": "__notebook_cell__"})
    printed = capsys.readouterr().out
    committed = committed_stdout(cell)
    if more_follows:  # the rest of the cell prints after the source: compare the source part only
        committed = committed[:len(printed)]
    assert printed == committed, (f"{path.name}, cell {index} prints source that changed since the notebook ran: "
                                  "re-execute the notebook")


def test_print_source_prints_a_part(capsys):
    def example():
        a = 1
        b = 2  # start here
        c = 3
        return a + b + c  # stop here

    print_source(example, start="start here", stop="stop here")
    assert capsys.readouterr().out == "        b = 2  # start here\n        c = 3\n" \
                                      "        return a + b + c  # stop here\n\n"
    print_source(example, lines_with=("a = ", "c = "))
    assert capsys.readouterr().out == "        a = 1\n        c = 3\n\n"


def test_a_marker_that_matches_nothing_fails_loudly():
    def example():
        return 1

    for part in (dict(start="gone"), dict(stop="gone"), dict(lines_with="gone")):
        with pytest.raises(ValueError, match="gone"):
            print_source(example, **part)
