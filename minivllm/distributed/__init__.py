"""Tensor parallelism's state: which rank this process is, its group, and the collectives.

`parallel_state` is all of it. The layers that split a model live in `minivllm.layers.parallel`; the
processes of the other ranks are started and driven by the executor (`minivllm.executor`).
"""
from .parallel_state import tp_rank, tp_size

__all__ = ["tp_rank", "tp_size"]
