"""Which GPU the kernels' launch settings are chosen for: the device's, or one named in the environment.

Tile sizes, warps and pipeline stages are chosen per GPU generation (its CUDA compute capability),
because what fits and what is fast differs: an H200 (sm_90) gives a program up to 227 KiB of shared
memory and feeds `tl.dot` to tensor cores, while Colab's free T4 (sm_75) gives 64 KiB, and there
Triton (3.3 and later) runs `tl.dot` on the ordinary FMA units, staging both operands in shared
memory widened to fp32. Settings that fit an H200 can need more than a T4 has.

The settings choosers in the kernel files ask `kernel_capability` rather than torch, so that

    MINIVLLM_KERNEL_CAPABILITY=7.5

makes any GPU launch the kernels with a T4's settings: the same tiles, warps and stages, though
the code is still compiled for (and timed on) the GPU at hand, and decode's split-K count still
follows that GPU's number of SMs. And a machine with no GPU at all can compile a T4's kernels and
check their shared memory (tests/test_kernels_t4.py).
"""
from __future__ import annotations

import functools
import os

import torch

ENV_VAR = "MINIVLLM_KERNEL_CAPABILITY"


@functools.cache  # asked at every kernel launch of every layer: decided once per device, then looked up
def kernel_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) to choose a CUDA device's launch settings for: MINIVLLM_KERNEL_CAPABILITY
    ("7.5") when set, else the device's own capability. Decided the first time a device is asked
    about: set the variable before the first launch (a test that changes it calls `cache_clear()`)."""
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
