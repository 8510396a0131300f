"""Tensor-parallel state and collectives; the split layers are in `minivllm.layers.parallel`."""
from .parallel_state import tp_rank, tp_size

__all__ = ["tp_rank", "tp_size"]
