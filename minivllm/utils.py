"""Small shared helpers: progress bars, the smoke-mode switch, and messages that read right."""
from __future__ import annotations

import functools
import logging
import os


def smoke_mode() -> bool:
    """MINIVLLM_SMOKE=1: tiny sizes everywhere (CI runs the notebooks this way)."""
    return os.environ.get("MINIVLLM_SMOKE", "") not in ("", "0")


def progress(iterable=None, total=None, desc=None, enabled: bool = True):
    """A tqdm bar (notebook-aware), switched off in smoke mode and when asked."""
    from tqdm.auto import tqdm
    return tqdm(iterable, total=total, desc=desc, disable=not enabled or smoke_mode(), dynamic_ncols=True)


def plural(n: int, word: str, many: str | None = None) -> str:
    """The count and its noun: plural(1, "launch", "launches") -> '1 launch', plural(3, "step") -> '3 steps'."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


@functools.cache
def warning_once(logger: logging.Logger, message: str) -> None:
    """`logger.warning(message)` once per process (vLLM's `logger.warning_once`): a notebook or a benchmark that
    builds engine after engine is told once."""
    logger.warning(message)
