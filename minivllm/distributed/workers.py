"""The worker processes of a tensor-parallel engine, started and stopped by the engine itself.

`LLM(model, tensor_parallel_size=N)` runs in one process, rank 0: it schedules, samples and talks
to users, and runs its slice of the model. It starts N - 1 worker processes (ranks 1 .. N-1), each
with a `ModelRunner` holding its slice of the weights and of the KV cache, on its own GPU (or CPU).
A worker does only what rank 0 tells it: rank 0 broadcasts `(method name, arguments)` on a gloo
group, and every worker calls that method of its runner; inside it the collectives of the forward
(all-reduce, all-gather, the batch's broadcast) meet those of rank 0. So the same scheduler decision
runs everywhere, and nothing but rank 0 ever decides anything.

    >>> workers = TensorParallelWorkers(2, "cpu", runner_args)   # this process becomes rank 0
    >>> runner = ModelRunner(**runner_args); runner.workers = workers; workers.wait_ready()
    >>> workers.call("initialize_kv_cache", 64)    # (what `@on_every_rank` does for the runner)
    >>> workers.shutdown()

Failure: a worker that cannot start sends its traceback back (`wait_ready` raises it); one that dies
later is found by `check_alive` before each call, or when a collective with it fails: a clear
`RuntimeError` either way, never a silent hang.
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
import torch.distributed as dist

from .parallel_state import cpu_group, destroy_tensor_parallel, init_tensor_parallel

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
        # Each worker is a fresh `python -m minivllm.distributed`, not a multiprocessing child:
        # nothing of the user's script is imported again, so it needs no `if __name__ == "__main__"`
        # guard, and a notebook works the same. Its start-up arguments arrive pickled on stdin.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))
        self.processes: dict[int, subprocess.Popen] = {}
        for rank in range(1, world_size):
            process = subprocess.Popen([sys.executable, "-m", "minivllm.distributed"], env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            process.stdin.write(pickle.dumps((rank, world_size, init_method, device_type,
                                              dict(runner_args, device=rank_device(device, rank)))))
            process.stdin.close()
            self.processes[rank] = process
        try:
            init_tensor_parallel(0, world_size, init_method, device_type)  # waits for every rank to join
        except BaseException:
            self._kill_all()
            raise

    def wait_ready(self) -> None:
        """Wait until every worker has built its model: raise a worker's own error if one could not."""
        for rank, process in self.processes.items():
            waited = 0.0
            while not select.select([process.stdout], [], [], 0.5)[0]:
                self.check_alive()
                waited += 0.5
                if waited > STARTUP_TIMEOUT_S:
                    raise RuntimeError(f"tensor-parallel worker {rank} did not start in {STARTUP_TIMEOUT_S} s")
            try:
                message = pickle.load(process.stdout)
            except EOFError:  # it died before it could say why
                message = f"exit code {process.wait()}"
            if message != "ready":
                raise RuntimeError(f"tensor-parallel worker {rank} failed to start:\n{message}")

    def check_alive(self) -> None:
        for rank, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"tensor-parallel worker {rank} (pid {process.pid}) has died with exit code "
                                   f"{process.returncode}: the engine cannot run without it; start a new one")

    def call(self, method: str, *args) -> None:
        """Every worker's runner runs `method(*args)` (rank 0 runs it too, right after)."""
        self.check_alive()
        try:
            dist.broadcast_object_list([method, args], src=0, group=cpu_group())
        except RuntimeError:
            self.check_alive()
            raise

    def shutdown(self) -> None:
        """Tell the workers to stop, wait for them (a stuck one is killed), leave the group."""
        if not self.processes:
            return
        try:
            if all(p.poll() is None for p in self.processes.values()):
                dist.broadcast_object_list(["exit", ()], src=0, group=cpu_group())
        except RuntimeError:
            pass  # a worker is gone already: the others are killed below
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._kill_all()
        destroy_tensor_parallel()

    def _kill_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
            process.stdout.close()
        self.processes = {}


def worker_main() -> None:
    """A worker's whole life: join the group, build its runner, run what rank 0 broadcasts."""
    from ..engine.model_runner import ModelRunner  # here: the engine imports this module

    rank, world_size, init_method, device_type, runner_args = pickle.load(sys.stdin.buffer)
    # stdout is the line back to rank 0; anything the worker prints goes to stderr instead.
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        if device_type == "cuda":
            torch.cuda.set_device(runner_args["device"])
        else:  # share the cores with the other ranks rather than all fight over all of them
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        init_tensor_parallel(rank, world_size, init_method, device_type)
        runner = ModelRunner(**runner_args)
    except BaseException:
        pickle.dump(traceback.format_exc(), reply)
        reply.flush()
        raise SystemExit(1)
    pickle.dump("ready", reply)
    reply.flush()
    try:
        while True:
            message = [None, None]
            dist.broadcast_object_list(message, src=0, group=cpu_group())
            method, args = message
            if method == "exit":
                break
            getattr(runner, method)(*args)
    finally:
        destroy_tensor_parallel()
