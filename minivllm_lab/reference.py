"""The committed run's numbers, beside the reader's: "yours vs the H200", each column named by its hardware.

The notebooks were executed on an NVIDIA H200 and their committed JSON (`figures/<name>.json`) holds that
run's numbers. A reader runs them on another GPU or a laptop CPU, where every number differs. So a
notebook's prose should not quote the H200's numbers as if they were the reader's: its sentences print
this run's numbers, and the committed run's stand beside them as a labelled reference.

    >>> ref = load_reference("00_baseline")   # first thing in the notebook: its own run overwrites the file
    >>> print(ref.table([("output tok/s", summary["output_tok_s"], "summary.output_tok_s")], env.hardware))
    metric        yours (CPU (AMD EPYC, 2 cores))   committed (NVIDIA H200)
    output tok/s  4.1                               17.7

Where the committed numbers come from: in a clone, the repository's `figures/` folder; where only the
notebook was opened (Colab), the same file from the repository's raw URL (pyproject.toml's
`[project.urls] Repository`, which the installed package's metadata also carries); offline, nothing,
and the reference says so instead of failing the notebook.
"""
from __future__ import annotations

import json
import textwrap
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MISSING = "n/a"  # what a table or a sentence shows where the committed run has no number


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
    """One committed run: its JSON (None if it could not be had) and where it came from, or why not."""
    name: str
    data: dict | None
    where: str

    @property
    def found(self) -> bool:
        return self.data is not None

    @property
    def hardware(self) -> str:
        """The committed run's hardware, as its JSON names it (most figures JSON have a "hardware" field)."""
        if self.data is None:
            return "committed run, not available"
        return str(self.data.get("hardware") or "committed run, hardware not recorded")

    def value(self, key):
        """A number of the committed run by its path in the JSON ("summary.output_tok_s", "rows.0.tok_s"),
        or a function of the JSON (`pick`); None where the run is missing or has no such number."""
        return None if self.data is None else lookup(self.data, key)

    def fmt(self, key, spec: str = ",.1f") -> str:
        """The committed number formatted for a sentence, or "n/a": an f-string never fails on it."""
        return _format(self.value(key), spec)

    def table(self, rows, yours: str, spec: str = ",.1f") -> str:
        """A small table, one row per (label, your value, key of the committed value[, format]); the
        columns are named by their hardware. Returned as text, to print."""
        header = ["metric", f"yours ({yours})", f"committed ({self.hardware})"]
        lines = []
        for label, mine, key, *row_spec in rows:  # a row's own format (".0%") wins over the table's
            fmt = row_spec[0] if row_spec else spec
            lines.append([label, _format(mine, fmt), self.fmt(key, fmt)])
        widths = [max(len(line[i]) for line in [header, *lines]) for i in range(3)]
        text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
                for line in [header, *lines]]
        if not self.found:
            text.append(f"(no committed numbers: {self.where})")
        return "\n".join(text)

    def beside(self, run: dict, rows, yours: str | None = None, spec: str = ",.1f") -> str:
        """`table` for a run saved in the same form as the committed one (the notebook's own JSON, just
        written): rows of (label, key[, format]), each key looked up in both runs."""
        yours = yours or str(run.get("hardware", "this run"))
        return self.table([(label, lookup(run, key), key, *rest) for label, key, *rest in rows], yours, spec)

    def readings(self, mine: dict, sentences, describe=None, width: int = 110) -> str:
        """A "Reading the run" paragraph's numbers: `sentences(run)` (a run's JSON -> its sentences) for
        this run, then for the committed run, each headed by its hardware and `describe(run)` if given.
        Returned as text, to print; the committed part says why it is missing where it is."""
        text = []
        for label, run in [("your run", mine), ("the committed run", self.data)]:
            if run is None:
                text.append(f"{label}: not available ({self.where})")
                continue
            text.append(f"{label}, on {run.get('hardware', 'unnamed hardware')}"
                        + (f", {describe(run)}" if describe else "") + ":")
            text += [textwrap.fill(s, width, initial_indent="- ", subsequent_indent="  ") for s in sentences(run)]
            text.append("")
        return "\n".join(text).rstrip()

    def __str__(self) -> str:
        state = f"the committed run on {self.hardware}" if self.found else "no committed run"
        return f"reference {self.name}: {state} ({self.where})"


def load_reference(name: str, figures: Path | None = None, url: str | None = None,
                   timeout_s: float = 5.0) -> Reference:
    """The committed `figures/<name>.json`: read it from `figures` (default: the clone's figures/ folder),
    or fetch it from `url` (default: the repository's raw URL); never raises."""
    folder = Path(figures) if figures is not None else REPO_ROOT / "figures"
    path = folder / f"{name}.json"
    if path.exists():
        return Reference(name, json.loads(path.read_text()), str(path))
    url = url or raw_url(name)
    if url is None:
        return Reference(name, None, f"{path} is missing and the repository's URL is unknown")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return Reference(name, json.loads(response.read().decode()), url)
    except (OSError, ValueError) as error:  # offline, 404, or not JSON: the notebook goes on without it
        return Reference(name, None, f"offline or not found: {url} ({type(error).__name__})")


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
