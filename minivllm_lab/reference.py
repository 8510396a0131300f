"""The committed run's headline numbers beside this run's, each column named by its hardware.

The committed notebooks are one run of the series on one GPU: their outputs are that run, and its
numbers are saved in `figures/<name>.json`. A reader who runs a notebook elsewhere (a T4, a laptop CPU)
replaces those outputs with their own, so a notebook reads the committed JSON first and prints a small table
of this run beside it. The run that makes the committed outputs sets MINIVLLM_REFERENCE_RUN=1
(scripts/gpu_notebooks.sh does): it is the committed run, and its tables have one column.

    >>> committed = load_reference("00_baseline")   # first thing in the notebook: its own run overwrites the file
    >>> print(committed.beside(mine, [("output tok/s", "summary.output_tok_s")]))
    metric        this run (CPU (AMD EPYC, 2 cores))   committed run (NVIDIA H100 80GB HBM3)
    output tok/s  4.1                                  15.0

Where the committed numbers come from: in a clone, the repository's `figures/` folder; where only the
notebook was opened (Colab), the same file from the repository's raw URL (pyproject.toml's
`[project.urls] Repository`, which the installed package's metadata also carries); offline, nothing,
and the table says so instead of failing the notebook.
"""
from __future__ import annotations

import json
import os
import textwrap
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MISSING = "n/a"  # what a table or a sentence shows where the committed run has no number
REFERENCE_RUN_VARIABLE = "MINIVLLM_REFERENCE_RUN"


def this_is_the_reference_run() -> bool:
    """True in the run whose outputs are committed (MINIVLLM_REFERENCE_RUN=1): it has no other run beside it."""
    return os.environ.get(REFERENCE_RUN_VARIABLE) == "1"


def repository_url() -> str | None:
    """pyproject.toml's [project.urls] Repository: from the clone, else from the installed package."""
    pyproject = REPO_ROOT / "pyproject.toml"
    if pyproject.exists():
        return tomllib.loads(pyproject.read_text())["project"]["urls"]["Repository"]
    try:
        from importlib.metadata import PackageNotFoundError, metadata
        for entry in metadata("minivllm").get_all("Project-URL") or []:  # "Repository, https://..."
            label, _, url = entry.partition(",")
            if label.strip() == "Repository":
                return url.strip()
    except PackageNotFoundError:
        pass
    return None


def raw_url(name: str, repository: str | None = None, branch: str = "main") -> str | None:
    """The committed `figures/<name>.json` on GitHub's raw server."""
    repository = repository or repository_url()
    if repository is None:
        return None
    path = repository.removeprefix("https://github.com/").removesuffix(".git").strip("/")
    return f"https://raw.githubusercontent.com/{path}/{branch}/figures/{name}.json"


@dataclass
class Reference:
    """One committed run: its JSON (None if it could not be had, or if this run is the committed one) and where
    it came from, or why not."""
    name: str
    data: dict | None
    where: str
    is_this_run: bool = False
    kind: str = "committed run"  # "benchmark run" for a benchmark's JSON, made by another run than the notebooks'

    @property
    def found(self) -> bool:
        return self.data is not None

    @property
    def hardware(self) -> str:
        """The committed run's hardware, as its JSON names it (most figures JSON have a "hardware" field)."""
        if self.data is None:
            return "not available"
        return str(self.data.get("hardware") or "committed run, hardware not recorded")

    def value(self, key):
        """A number of the committed run by its path in the JSON ("summary.output_tok_s", "rows.0.tok_s"),
        or a function of the JSON (`pick`); None where the run is missing or has no such number."""
        return None if self.data is None else lookup(self.data, key)

    def fmt(self, key, spec: str = ",.1f") -> str:
        """The committed number formatted for a sentence, or "n/a": an f-string never fails on it."""
        return _format(self.value(key), spec)

    def table(self, rows, yours: str, spec: str = ",.1f") -> str:
        """A small table, one row per (label, this run's value, key of the committed value[, format]); the
        columns are named by their hardware, the committed one left out in the committed run itself.
        Returned as text, to print."""
        header = ["metric", f"this run ({yours})"] + ([] if self.is_this_run else [f"{self.kind} ({self.hardware})"])
        lines = []
        for label, mine, key, *row_spec in rows:  # a row's own format (".0%") wins over the table's
            fmt = row_spec[0] if row_spec else spec
            lines.append([label, _format(mine, fmt)] + ([] if self.is_this_run else [self.fmt(key, fmt)]))
        widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
        text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
                for line in [header, *lines]]
        if not self.found and not self.is_this_run:
            text.append(f"(no committed numbers: {self.where})")
        return "\n".join(text)

    def beside(self, run: dict, rows, yours: str | None = None, spec: str = ",.1f") -> str:
        """`table` for a run saved in the same form as the committed one (the notebook's own JSON, just
        written): rows of (label, key[, format]), each key looked up in both runs."""
        yours = yours or str(run.get("hardware", "unnamed hardware"))
        return self.table([(label, lookup(run, key), key, *rest) for label, key, *rest in rows], yours, spec)

    def __str__(self) -> str:
        if self.is_this_run:
            return f"reference {self.name}: this run is the committed run ({REFERENCE_RUN_VARIABLE}=1)"
        state = f"the {self.kind} on {self.hardware}" if self.found else f"no {self.kind}"
        return f"reference {self.name}: {state} ({self.where})"


def load_reference(name: str, figures: Path | None = None, url: str | None = None,
                   timeout_s: float = 5.0, written_by_this_run: bool = True) -> Reference:
    """The committed `figures/<name>.json`: read it from `figures` (default: the clone's figures/ folder),
    or fetch it from `url` (default: the repository's raw URL); never raises. In the committed run itself
    (MINIVLLM_REFERENCE_RUN=1) there is none to read where the file is one this run is about to write; a file
    another run made (`written_by_this_run=False`: a benchmark's JSON that a notebook shows) is read as ever."""
    if written_by_this_run and this_is_the_reference_run():
        return Reference(name, None, "this run makes the committed outputs", is_this_run=True)
    kind = "committed run" if written_by_this_run else "benchmark run"
    folder = Path(figures) if figures is not None else REPO_ROOT / "figures"
    path = folder / f"{name}.json"
    if path.exists():
        return Reference(name, json.loads(path.read_text()), str(path), kind=kind)
    url = url or raw_url(name)
    if url is None:
        return Reference(name, None, f"{path} is missing and the repository's URL is unknown", kind=kind)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return Reference(name, json.loads(response.read().decode()), url, kind=kind)
    except (OSError, ValueError) as error:  # offline, 404, or not JSON: the notebook goes on without it
        return Reference(name, None, f"offline or not found: {url} ({type(error).__name__})", kind=kind)


def readings(run: dict, sentences, describe=None, width: int = 110) -> str:
    """A run's numbers as sentences (`sentences(run)`: a run's JSON -> its sentences), headed by its hardware
    and `describe(run)` if given: what a "Reading the run" paragraph talks about. Returned as text, to print."""
    head = f"this run, on {run.get('hardware', 'unnamed hardware')}" + (f", {describe(run)}" if describe else "")
    return "\n".join([head + ":"] + [textwrap.fill(s, width, initial_indent="- ", subsequent_indent="  ")
                                     for s in sentences(run)])


def lookup(data, key):
    """`data`'s value at a dotted path ("a.b.0.c"), or `key(data)` for a function; None if absent."""
    if callable(key):
        try:
            return key(data)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, StopIteration):
            return None
    node = data
    for part in key.split("."):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return node


def pick(rows: str, field: str, **match):
    """A key for `value`, `beside` and `table`: `field` of the first row of the list at path `rows`
    whose items equal `match` ("end_to_end.rows", "output_tok_s", path="KV cache"); rows differ in
    number and order between machines, so they are found by what they are, not by their place."""
    def find(data):
        return next(row[field] for row in lookup(data, rows) if all(row.get(k) == v for k, v in match.items()))
    find.__name__ = f"{rows}[{match}].{field}"
    return find


def _format(value, spec: str) -> str:
    if value is None:
        return MISSING
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)
