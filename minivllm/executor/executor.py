"""The executor: the engine's one handle on the model, whether it runs in this process or over N ranks.

The engine asks for three things, and does not care how many processes answer:

- `collective_rpc(method, *args)`: every rank's runner runs `method` (a `ModelRunner` method's name, or a
  function called as `function(runner, *args)`) with the same arguments; rank 0's result comes back. Set-up
  goes this way (the KV pool's size, allocating it, capturing CUDA graphs), as does a benchmark that must
  run on every rank;
- `execute_model(scheduler_output)`: one step's forward, logits on rank 0's device, not waited for;
- `sample(logits, scheduler_output)`: rank 0 picks the tokens (under the grammars' bitmask, if any).

`Executor` is one rank in this process (vLLM's UniProcExecutor). `TensorParallelExecutor` is rank 0 here
and N - 1 worker processes (`workers.py`): rank 0 packs the step's batch once and the workers receive it by
broadcast inside `execute_batch`. If a call fails on rank 0 after the workers have started it, the ranks are
out of step: the workers are stopped and the next call says why, rather than leave them waiting forever.

    >>> executor = make_executor(runner_args, tensor_parallel_size=2, device="cuda")
    >>> executor.collective_rpc("initialize_kv_cache", 1024)
    >>> logits = executor.execute_model(scheduler_output)
"""
from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from ..core.scheduler import SchedulerOutput
from ..structured_output import GrammarBitmask
from ..worker.model_runner import ModelRunner, SampledTokens, VerifiedTokens
from .workers import TensorParallelWorkers, call_on_runner


class Executor:
    """One rank, in this process."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner  # rank 0's runner: the one in this process

    def collective_rpc(self, method: str | Callable, *args, **kwargs):
        return call_on_runner(self.runner, method, args, kwargs)

    def execute_model(self, scheduler_output: SchedulerOutput) -> torch.Tensor:
        return self.runner.execute_model(scheduler_output)

    def sample(self, logits: torch.Tensor, scheduler_output: SchedulerOutput, draft_probs: torch.Tensor | None = None,
               grammar_bitmask: GrammarBitmask | None = None) -> SampledTokens | VerifiedTokens:
        return self.runner.sample(logits, scheduler_output, draft_probs, grammar_bitmask)

    def shutdown(self) -> None:
        """Nothing to stop with one rank."""


class TensorParallelExecutor(Executor):
    """Rank 0 in this process, ranks 1 .. N-1 in worker processes that run what rank 0 tells them."""

    def __init__(self, tensor_parallel_size: int, device: str, runner_args: dict):
        self.workers = TensorParallelWorkers(tensor_parallel_size, device, runner_args)
        # At exit, or when the executor is collected, the workers stop; the finalizer holds the workers only.
        self._stop_workers = weakref.finalize(self, self.workers.shutdown)
        try:
            super().__init__(ModelRunner(**runner_args))
            self.workers.wait_ready()
        except BaseException:
            self.shutdown()
            raise

    def collective_rpc(self, method: str | Callable, *args, **kwargs):
        self.workers.call(method, *args, **kwargs)
        name = method if isinstance(method, str) else method.__name__
        return self._run_on_rank_0(name, lambda: call_on_runner(self.runner, method, args, kwargs))

    def execute_model(self, scheduler_output: SchedulerOutput) -> torch.Tensor:
        flat, layout = self.runner.pack(scheduler_output)
        self.workers.call("execute_batch", layout)  # the workers receive `flat` from rank 0's broadcast
        return self._run_on_rank_0("execute_batch", lambda: self.runner.execute_batch(layout, flat))

    def _run_on_rank_0(self, name: str, call: Callable):
        """Rank 0's side of a call every rank makes. If it fails here, the workers are already in it and
        would wait for rank 0 forever: stop them, so the next call says why instead of hanging."""
        try:
            return call()
        except BaseException as e:
            try:
                self.workers.check_alive()
            except RuntimeError as dead:  # the failure was a worker's death: say so
                self.workers.abort(str(dead))
                raise dead from e
            self.workers.abort(f"rank 0 failed in {name}: {e!r}")
            raise

    def shutdown(self) -> None:
        self._stop_workers()  # runs the workers' shutdown once, however often it is called


def make_executor(runner_args: dict, tensor_parallel_size: int, device: str) -> Executor:
    if tensor_parallel_size > 1:
        return TensorParallelExecutor(tensor_parallel_size, device, runner_args)
    return Executor(ModelRunner(**runner_args))
