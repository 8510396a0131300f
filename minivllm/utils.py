"""Small shared helpers: progress bars and the smoke-mode switch."""
from __future__ import annotations

import os


def smoke_mode() -> bool:
    """MINIVLLM_SMOKE=1: tiny sizes everywhere (CI runs the notebooks this way)."""
    return os.environ.get("MINIVLLM_SMOKE", "") not in ("", "0")


def progress(iterable=None, total=None, desc=None, enabled: bool = True):
    """A tqdm bar (notebook-aware), switched off in smoke mode and when asked."""
    from tqdm.auto import tqdm
    return tqdm(iterable, total=total, desc=desc, disable=not enabled or smoke_mode(), dynamic_ncols=True)
