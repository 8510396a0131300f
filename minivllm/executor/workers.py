"""The worker processes of a tensor-parallel engine, started and stopped by the engine itself.

`LLM(model, tensor_parallel_size=N)` runs in one process, rank 0: it schedules, samples and talks
to users, and runs its slice of the model. It starts N - 1 worker processes (ranks 1 .. N-1), each
with a `ModelRunner` holding its slice of the weights and of the KV cache, on its own GPU (or CPU).
A worker does only what rank 0 tells it: rank 0 writes `(method, arguments)` to every worker's
stdin (a runner method's name, or a function of the runner, pickled by reference), and every worker
calls it on its runner; inside it the collectives of the forward
(all-reduce, all-gather, the batch's broadcast) meet those of rank 0. So the same scheduler decision
runs everywhere, and nothing but rank 0 ever decides anything. (The commands go through a pipe, not a
collective: a worker may wait for the next one for hours without a timeout, and when rank 0's process
ends, however it ends, the pipe closes and the worker leaves.)

    >>> workers = TensorParallelWorkers(2, "cpu", runner_args)   # this process becomes rank 0
    >>> runner = ModelRunner(**runner_args); workers.wait_ready()
    >>> workers.call("initialize_kv_cache", 64); runner.initialize_kv_cache(64)   # (what the executor does)
    >>> workers.shutdown()

Failure: a worker that cannot start sends its traceback back (rank 0 raises it); one that dies later
is found by `check_alive` before each call, or when a collective with it fails on the CPU (gloo sees
the connection close): a clear `RuntimeError`, and the group is torn down (`abort`), since the ranks
can no longer be in step. On GPUs, a collective waiting for a dead peer is only ended by NCCL's
timeout (the group's `timeout_s`), which aborts the process.
"""
from __future__ import annotations

import os
import pickle
import select
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import torch

from ..distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel
from ..worker.model_runner import ModelRunner

STARTUP_TIMEOUT_S = 600  # loading a slice of a big checkpoint, compiling kernels


def rank_device(device: str, rank: int) -> str:
    """Rank r's device: the r-th GPU from the engine's own, or the CPU for every rank."""
    parsed = torch.device(device)
    return "cpu" if parsed.type == "cpu" else f"cuda:{(parsed.index or 0) + rank}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TensorParallelWorkers:
    def __init__(self, world_size: int, device: str, runner_args: dict):
        device_type = torch.device(device).type
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        self.broken: str | None = None  # why the group can no longer run, once it cannot
        # Each worker is a fresh `python -m minivllm.executor`, not a multiprocessing child:
        # nothing of the user's script is imported again, so it needs no `if __name__ == "__main__"`
        # guard, and a notebook works the same. Its start-up arguments arrive pickled on stdin.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))
        self.processes: dict[int, subprocess.Popen] = {}
        for rank in range(1, world_size):
            process = subprocess.Popen([sys.executable, "-m", "minivllm.executor"], env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self.processes[rank] = process
            self._send(process, (rank, world_size, init_method, device_type,
                                 dict(runner_args, device=rank_device(device, rank))))
        try:
            # Every worker first says it is about to join (or why it cannot): only then does this
            # process wait in the group's rendezvous, which it could not leave if a worker never came.
            self._expect("joining")
            init_tensor_parallel(0, world_size, init_method, device_type)
        except BaseException:
            self.abort("it failed to start")
            raise

    def wait_ready(self) -> None:
        """Wait until every worker has built its model: raise a worker's own error if one could not."""
        self._expect("ready")

    def _expect(self, word: str) -> None:
        for rank, process in self.processes.items():
            waited = 0.0
            while not select.select([process.stdout], [], [], 0.5)[0]:
                self.check_alive()
                waited += 0.5
                if waited > STARTUP_TIMEOUT_S:
                    raise RuntimeError(f"tensor-parallel worker {rank} did not start in {STARTUP_TIMEOUT_S} s")
            try:
                message = pickle.load(process.stdout)
            except (EOFError, pickle.UnpicklingError):  # it died before it could say why
                message = f"exit code {process.wait()}"
            if message != word:
                raise RuntimeError(f"tensor-parallel worker {rank} failed to start:\n{message}")

    def check_alive(self) -> None:
        if self.broken:
            raise RuntimeError(f"this tensor-parallel engine cannot run: {self.broken}; shut it down "
                               "(LLM.shutdown()) and start a new one")
        for rank, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"tensor-parallel worker {rank} (pid {process.pid}) has died with exit code "
                                   f"{process.returncode}: the engine cannot run without it; shut it down "
                                   "(LLM.shutdown()) and start a new one")

    def call(self, method, *args, **kwargs) -> None:
        """Every worker's runner runs `method(*args, **kwargs)` (rank 0 runs it too, right after)."""
        self.check_alive()
        for process in self.processes.values():
            self._send(process, (method, args, kwargs))

    @staticmethod
    def _send(process: subprocess.Popen, message) -> None:
        process.stdin.write(pickle.dumps(message))
        process.stdin.flush()

    def abort(self, why: str) -> None:
        """The ranks are out of step (a call failed on one of them): kill the workers, leave the group."""
        self.broken = self.broken or why
        self._stop(graceful=False)

    def shutdown(self) -> None:
        """Tell the workers to stop, wait for them (one that does not stop is killed), leave the group."""
        self.broken = self.broken or "it was shut down"
        self._stop(graceful=True)

    def _stop(self, graceful: bool) -> None:
        for process in self.processes.values():
            try:
                if graceful and process.poll() is None:
                    self._send(process, ("exit", (), {}))
                process.stdin.close()  # a worker reading its next command sees the end and leaves
            except OSError:
                pass  # it is gone already
        for process in self.processes.values():
            try:
                process.wait(timeout=30 if graceful else 5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()
        self.processes = {}
        destroy_tensor_parallel()


def call_on_runner(runner: ModelRunner, method, args, kwargs):
    """`method` is a runner method's name, or a function called as `method(runner, *args, **kwargs)`."""
    if isinstance(method, str):
        return getattr(runner, method)(*args, **kwargs)
    return method(runner, *args, **kwargs)


def worker_main(reply) -> None:
    """A worker's whole life: join the group, build its runner, run what rank 0 sends.
    `reply` is the line back to rank 0 (the process's original stdout)."""
    def send(message):
        pickle.dump(message, reply)
        reply.flush()

    commands = sys.stdin.buffer
    try:
        rank, world_size, init_method, device_type, runner_args = pickle.load(commands)
        if device_type == "cuda":
            torch.cuda.set_device(runner_args["device"])
        else:  # share the cores with the other ranks rather than all fight over all of them
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    except BaseException:
        send(traceback.format_exc())
        raise
    send("joining")
    try:
        init_tensor_parallel(rank, world_size, init_method, device_type)
        runner = ModelRunner(**runner_args)
    except BaseException:
        send(traceback.format_exc())
        raise
    send("ready")
    try:
        while True:
            try:
                method, args, kwargs = pickle.load(commands)
            except EOFError:  # rank 0 has gone
                break
            if method == "exit":
                break
            call_on_runner(runner, method, args, kwargs)
    finally:
        destroy_tensor_parallel()
