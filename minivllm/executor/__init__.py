"""The executor: one rank in this process, or N ranks (tensor parallelism) driven from it.

- `executor.py`: `Executor` / `TensorParallelExecutor`, the engine's handle on the model runners;
- `workers.py`: starting, driving and stopping the worker processes of ranks 1 .. N-1;
- `__main__.py`: a worker's process (`python -m minivllm.executor`).
"""
from .executor import Executor, TensorParallelExecutor, make_executor

__all__ = ["Executor", "TensorParallelExecutor", "make_executor"]
