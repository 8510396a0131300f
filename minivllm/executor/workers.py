"""Worker processes for tensor parallelism: ranks 1 .. N-1, each with its own `ModelRunner`.

Workers run the runner calls rank 0 sends, pickled, over their stdin. A pipe rather than a collective
lets an idle worker wait without a timeout and exit when rank 0's process ends.
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

STARTUP_TIMEOUT_S = 600


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
        self.broken: str | None = None  # the reason the group can no longer run
        # Not multiprocessing, so the user's script needs no `if __name__ == "__main__"` guard.
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
            # Enter the rendezvous only once every worker has started, since it cannot be left.
            self._expect("joining")
            init_tensor_parallel(0, world_size, init_method, device_type)
        except BaseException:
            self.abort("it failed to start")
            raise

    def wait_ready(self) -> None:
        """Wait until every worker has built its model; raise a worker's error if one failed."""
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
            except (EOFError, pickle.UnpicklingError):  # died before sending its traceback
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
        """Send `method(*args, **kwargs)` to every worker; the caller runs rank 0's part."""
        self.check_alive()
        for process in self.processes.values():
            self._send(process, (method, args, kwargs))

    @staticmethod
    def _send(process: subprocess.Popen, message) -> None:
        process.stdin.write(pickle.dumps(message))
        process.stdin.flush()

    def abort(self, why: str) -> None:
        """Kill the workers and leave the group after a failed call."""
        self.broken = self.broken or why
        self._stop(graceful=False)

    def shutdown(self) -> None:
        """Stop the workers (killing any that hang) and leave the group."""
        self.broken = self.broken or "it was shut down"
        self._stop(graceful=True)

    def _stop(self, graceful: bool) -> None:
        for process in self.processes.values():
            try:
                if graceful and process.poll() is None:
                    self._send(process, ("exit", (), {}))
                process.stdin.close()  # the worker exits on EOF
            except OSError:
                pass
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
    """`method` is a runner method's name or a function called as `method(runner, *args, **kwargs)`."""
    if isinstance(method, str):
        return getattr(runner, method)(*args, **kwargs)
    return method(runner, *args, **kwargs)


def worker_main(reply) -> None:
    """Join the group, build the runner, then run rank 0's commands until exit or EOF.
    `reply` is the process's original stdout."""
    def send(message):
        pickle.dump(message, reply)
        reply.flush()

    commands = sys.stdin.buffer
    try:
        rank, world_size, init_method, device_type, runner_args = pickle.load(commands)
        if device_type == "cuda":
            torch.cuda.set_device(runner_args["device"])
        else:  # split the CPU cores between ranks
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
            except EOFError:  # rank 0 exited
                break
            if method == "exit":
                break
            call_on_runner(runner, method, args, kwargs)
    finally:
        destroy_tensor_parallel()
