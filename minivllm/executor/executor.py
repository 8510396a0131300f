"""The executor: the engine's interface to the model runner(s), for one rank or N tensor-parallel ranks.

`collective_rpc` runs a runner method on every rank and returns rank 0's result; `execute_model` runs one
step's forward; `sample` picks tokens on rank 0; `propose` fills a step's draft tokens (speculative decoding:
the proposer, and a draft model's runner, live here on rank 0). `Executor` is vLLM's UniProcExecutor.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from ..config import SpeculativeConfig
from ..core.scheduler import SchedulerOutput
from ..spec_decode import DraftModelProposer, make_proposer
from ..structured_output import GrammarBitmask
from ..worker.kv_cache import kv_bytes_per_token
from ..worker.model_runner import ModelRunner, SampledTokens, VerifiedTokens
from .workers import TensorParallelWorkers, call_on_runner


class Executor:
    """One rank, in this process."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.proposer = None  # speculative decoding (`add_proposer`)

    def add_proposer(self, config: SpeculativeConfig, runner_args: dict) -> None:
        """Before the KV pool is sized, so that a draft model's weights are counted."""
        self.proposer = make_proposer(config, runner_args)

    def collective_rpc(self, method: str | Callable, *args, **kwargs):
        return call_on_runner(self.runner, method, args, kwargs)

    def num_kv_blocks_that_fit(self, gpu_memory_utilization: float, max_num_batched_tokens: int,
                               kv_cache_memory_bytes: int | None = None) -> int:
        """The target's KV blocks that fit (in `kv_cache_memory_bytes` if given), and a draft model's as many
        (its cache has the same blocks)."""
        num_blocks = self.collective_rpc("num_kv_blocks_that_fit", gpu_memory_utilization, max_num_batched_tokens,
                                         kv_cache_memory_bytes)
        if isinstance(self.proposer, DraftModelProposer):
            target, draft = (kv_bytes_per_token(r.model_config, r.kv_cache_dtype)
                             for r in (self.runner, self.proposer.runner))
            num_blocks = num_blocks * target // (target + draft)
        return num_blocks

    def initialize_kv_cache(self, num_blocks: int) -> None:
        if isinstance(self.proposer, DraftModelProposer):
            self.proposer.runner.initialize_kv_cache(num_blocks)
        self.collective_rpc("initialize_kv_cache", num_blocks)

    def reserve_graph_memory(self, max_num_batched_tokens: int, num_speculative_tokens: int) -> None:
        """Before the KV pool is sized: the graphs' memory is kept out of it, and mixed steps up to the budget will
        be graphed (target model only)."""
        if self.collective_rpc("can_capture_cuda_graphs"):
            self.collective_rpc("reserve_graph_memory", max_num_batched_tokens, num_speculative_tokens)

    def capture_cuda_graphs(self, num_speculative_tokens: int) -> None:
        """Decode, verify and mixed graphs, where the runners can capture; a draft model's drafts are decodes."""
        if self.collective_rpc("can_capture_cuda_graphs"):
            self.collective_rpc("capture_cuda_graphs", num_speculative_tokens)
            if isinstance(self.proposer, DraftModelProposer):
                self.proposer.runner.capture_cuda_graphs(num_speculative_tokens)

    def propose(self, scheduler_output: SchedulerOutput) -> torch.Tensor | None:
        """Fill the step's verify entries with draft tokens; a draft model's distributions (None: one-hot)."""
        return self.proposer.propose(scheduler_output) if self.proposer is not None else None

    def execute_model(self, scheduler_output: SchedulerOutput) -> torch.Tensor:
        return self.runner.execute_model(scheduler_output)

    def sample(self, logits: torch.Tensor, scheduler_output: SchedulerOutput, draft_probs: torch.Tensor | None = None,
               grammar_bitmask: GrammarBitmask | None = None) -> SampledTokens | VerifiedTokens:
        return self.runner.sample(logits, scheduler_output, draft_probs, grammar_bitmask)

    def shutdown(self) -> None:
        """Nothing to stop with one rank."""


class TensorParallelExecutor(Executor):
    """Rank 0 in this process, ranks 1 .. N-1 in worker processes."""

    def __init__(self, tensor_parallel_size: int, device: str, runner_args: dict):
        self.workers = TensorParallelWorkers(tensor_parallel_size, device, runner_args)
        # Must not reference self, or the executor would never be collected.
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
        self.workers.call("execute_batch", layout)  # `flat` reaches them by broadcast
        return self._run_on_rank_0("execute_batch", lambda: self.runner.execute_batch(layout, flat))

    def _run_on_rank_0(self, name: str, call: Callable):
        """Run rank 0's part of a call; on failure, abort the workers, which would otherwise hang."""
        try:
            return call()
        except BaseException as e:
            try:
                self.workers.check_alive()
            except RuntimeError as dead:
                self.workers.abort(str(dead))
                raise dead from e
            self.workers.abort(f"rank 0 failed in {name}: {e!r}")
            raise

    def shutdown(self) -> None:
        self._stop_workers()  # idempotent


def make_executor(runner_args: dict, tensor_parallel_size: int, device: str) -> Executor:
    if tensor_parallel_size > 1:
        return TensorParallelExecutor(tensor_parallel_size, device, runner_args)
    return Executor(ModelRunner(**runner_args))
