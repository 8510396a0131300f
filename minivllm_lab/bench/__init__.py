"""Benchmark tools: the workloads we measure on, the metrics we report, and the roofline we compare to.

- ``workloads``: W1 (the post's 60 queries) and W2 (nano-vllm's offline benchmark) as token-id prompts.
- ``metrics``: TTFT / TPOT / end-to-end latency percentiles and tok/s from request outputs, GPU-safe timers,
  text tables and JSON results that name the hardware.
- ``roofline``: what the hardware allows (bytes / bandwidth, FLOPs / matmul rate), so that every measured
  number can be given as a fraction of the limit.
"""
