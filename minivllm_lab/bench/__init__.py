"""Benchmark tools: the workloads we measure on, the metrics we report, and the roofline we compare to.

- ``workloads``: W1 (the post's 60 queries) and W2 (nano-vllm's offline benchmark) as token-id prompts.
- ``metrics``: TTFT / TPOT / end-to-end latency percentiles and tok/s from request outputs, GPU-safe timers,
  text tables and JSON results that name the hardware.
- ``roofline``: what the hardware allows (bytes / bandwidth, FLOPs / matmul rate), so that every measured
  number can be given as a fraction of the limit.
"""
from contextlib import contextmanager


@contextmanager
def bench_extra():
    """Around an import of what the bench extra installs (matplotlib, httpx, jsonschema): without it, the error
    says what to install, not only what is missing."""
    try:
        yield
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"{e}: the benchmarks need minivllm's bench extra: pip install -e '.[bench]' in a "
                                  "clone (pip install 'minivllm[bench]' elsewhere)", name=e.name) from None
