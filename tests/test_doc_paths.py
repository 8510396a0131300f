"""Every file of the repository that the README, docs/*.md or a notebook names exists.

Notebooks and the README point readers at files ("the scheduler is `minivllm/core/scheduler.py`").
A module that moves leaves such a pointer dangling without any test noticing, and a learner who
opens it finds nothing. So every path under the repository's own folders that they name is checked.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A path under one of the repository's folders, ending in a file name with an extension (not the tail of
# a URL such as github.com/minivllm/minivllm/blob/...).
FOLDERS = "minivllm|minivllm_lab|scripts|tests|figures|notebooks"
PATH = re.compile(rf"(?<![\w/.-])((?:{FOLDERS})/[\w/.-]*\w\.(?:py|sh|json|png|html|ipynb))")


# A Markdown link or image target that is a relative path (not a URL, not an anchor), resolved from its file.
LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)\s#]+)(?:#[^)]*)?\)")


def markdown_files():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documents():
    for path in markdown_files():
        yield str(path.relative_to(ROOT)), path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path.name, "\n".join("".join(cell["source"]) for cell in cells)


@pytest.mark.parametrize("name, text", list(documents()), ids=lambda v: v if isinstance(v, str) and len(v) < 60 else "")
def test_named_files_exist(name, text):
    named = sorted(set(PATH.findall(text)))
    missing = [path for path in named if not (ROOT / path).exists()]
    assert missing == [], f"{name} names files that do not exist: {missing}"


def test_the_pattern_finds_paths():
    assert PATH.findall("see `minivllm/core/scheduler.py` and scripts/gpu_bench.sh.") == [
        "minivllm/core/scheduler.py", "scripts/gpu_bench.sh"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_links_resolve(path):
    """README's and docs/'s links and images point at files that exist, relative to the file that links."""
    targets = sorted(set(LINK.findall(path.read_text())))
    missing = [t for t in targets if not (path.parent / t).exists()]
    assert missing == [], f"{path.name} links to files that do not exist: {missing}"


def test_the_link_pattern():
    text = "[a](docs/x.md) [b](../figures/y.png) [c](https://e.org/z) [d](#top) [e](serving.md#how)"
    assert LINK.findall(text) == ["docs/x.md", "../figures/y.png", "serving.md"]
