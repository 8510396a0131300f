"""The executor: runs the model runner on one rank in this process, or on N tensor-parallel ranks."""
from .executor import Executor, TensorParallelExecutor, make_executor

__all__ = ["Executor", "TensorParallelExecutor", "make_executor"]
