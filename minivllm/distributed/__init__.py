"""Tensor parallelism: one model over several GPUs (NCCL) or CPU processes (gloo).

`parallel_state` says which rank this process is and holds the collectives; `workers` starts, drives
and stops the engine's worker processes. The split layers live with the model (`models.parallel_layers`).
"""
from .parallel_state import tp_rank, tp_size
from .workers import TensorParallelWorkers

__all__ = ["TensorParallelWorkers", "tp_rank", "tp_size"]
