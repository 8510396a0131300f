"""Small shared helpers: progress bars that stay quiet in CI, and the smoke-mode switch."""
from __future__ import annotations

import os


def smoke_mode() -> bool:
    """MINIVLLM_SMOKE=1: tiny sizes everywhere (CI runs the notebooks this way)."""
    return os.environ.get("MINIVLLM_SMOKE", "") not in ("", "0")


def progress(iterable=None, total=None, desc=None, enabled: bool = True):
    """A tqdm bar (notebook-aware), switched off in smoke mode and when asked."""
    from tqdm.auto import tqdm
    return tqdm(iterable, total=total, desc=desc, disable=not enabled or smoke_mode(), dynamic_ncols=True)


def default_model() -> str:
    """MINIVLLM_MODEL, else the notebooks' choice for this machine (`minivllm.notebook.choose_model`): the
    Mistral-7B shape on a GPU with room for it, the Llama-3.2-1B shape on a 16 GB one, SmolLM2 on a CPU."""
    import torch

    from .notebook import choose_model
    if not torch.cuda.is_available():
        return choose_model("cpu", None)[0]
    return choose_model("cuda", torch.cuda.get_device_properties(0).total_memory / 2**30)[0]


def figures_dir():
    """Where notebooks save plots: MINIVLLM_FIGURES if set, the repo's figures/ folder, or a scratch folder in
    smoke mode so that a CI run never overwrites the figures of a real GPU run."""
    import tempfile
    from pathlib import Path
    if os.environ.get("MINIVLLM_FIGURES"):  # a check run (the T4 profile) that must not replace the real figures
        path = Path(os.environ["MINIVLLM_FIGURES"])
    elif smoke_mode():
        path = Path(tempfile.gettempdir()) / "minivllm-figures"
    else:
        repo = Path(__file__).resolve().parent.parent
        path = repo / "figures" if (repo / "pyproject.toml").exists() else Path("figures")
    path.mkdir(parents=True, exist_ok=True)
    return path
