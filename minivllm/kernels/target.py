"""The compute capability the kernels' launch settings (tiles, warps, stages) are chosen for.

MINIVLLM_KERNEL_CAPABILITY=7.5 makes any GPU launch with a T4's settings, and lets a machine
without a GPU compile a T4's kernels (tests/test_kernels_t4.py).
"""
from __future__ import annotations

import functools
import os

import torch

ENV_VAR = "MINIVLLM_KERNEL_CAPABILITY"


@functools.cache  # asked at every kernel launch
def kernel_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) to choose launch settings for: MINIVLLM_KERNEL_CAPABILITY ("7.5") when set,
    else the device's own. Cached: set the variable before the first launch, or call `cache_clear()`."""
    override = os.environ.get(ENV_VAR)
    if override:
        return parse_capability(override)
    return torch.cuda.get_device_capability(device)


def parse_capability(text: str) -> tuple[int, int]:
    """"7.5" -> (7, 5), as torch.cuda.get_device_capability reports it."""
    major, dot, minor = text.strip().partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        raise ValueError(f"{ENV_VAR} must look like 7.5 or 9.0, not {text!r}")
    return int(major), int(minor)
