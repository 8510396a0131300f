"""The frontend's handle on the engine core: in a process of its own (MPClient) or in a thread (InprocClient).

Both start an `EngineCore` and then take the same three calls, `add_request`, `abort_requests`,
`shutdown`; what the core reports reaches two callbacks, `on_outputs(list[EngineCoreOutputs])` (called in
a thread of the client's, with every message that has arrived: one per step, or several when the
frontend is behind) and `on_dead(reason)` (once, if the core stops on its own).

MPClient, the default, is vLLM's V1 design: the core in a child process (a fresh interpreter that
runs `minivllm.engine.core.main`, so a user's script needs no `__main__` guard), two ZMQ PUSH/PULL sockets
over IPC with msgpack frames, and one receiving thread here. The core's stdin is a pipe from this
process: if this process dies, even by SIGKILL, the core reads end-of-file and exits. The core
dying is noticed within a poll interval: it sends `EngineCoreFailed` if it can, and its exit is
seen either way.

InprocClient runs the same loop in a thread of this process and hands messages over in memory: the
core then shares this interpreter (and its GIL) with the server. It exists for the ablation:
`AsyncLLM(..., engine_core_process=False)`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable

import torch

from ..config import EngineConfig
from .core import EngineCoreProc, make_engine_core, receive_all
from .core_messages import (
    AbortRequests,
    CoreOutput,
    EngineCoreFailed,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    Shutdown,
)

logger = logging.getLogger("minivllm.engine.core")
# A fresh interpreter (no fork of a process that may hold CUDA or threads); `-c`, not `-m`, since
# `python -m minivllm.engine.core` would import the module twice (the package imports it too).
CORE_PROCESS_MAIN = "import sys; from minivllm.engine.core import main; main(sys.argv[1:])"
POLL_MS = 100          # how often the receiving thread looks whether the core process is still alive
SHUTDOWN_TIMEOUT_S = 10


class CoreStartupError(RuntimeError):
    """The core process failed before it was ready (its message says why)."""


class InprocClient:
    def __init__(self, config: EngineConfig, on_outputs: Callable, on_dead: Callable):
        self.core = make_engine_core(config)
        self._inputs: queue.SimpleQueue = queue.SimpleQueue()
        self.proc = EngineCoreProc(self.core, self._inputs, lambda message: on_outputs([message]))
        self.ready = self.proc.ready_message()
        self._on_dead = on_dead
        self._thread = threading.Thread(target=self._run, name="minivllm-engine-core", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.proc.run_busy_loop()
        except BaseException as e:  # a bug, or the GPU gone: the frontend tells every stream
            logger.error("engine core failed:\n%s", traceback.format_exc())
            self._on_dead(f"the engine core stopped: {type(e).__name__}: {e}")

    def add_request(self, request: EngineCoreRequest) -> None:
        self._inputs.put(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self._inputs.put(AbortRequests(request_ids))

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self._inputs.put(Shutdown())
            self._thread.join()
        self.core.shutdown()


class MPClient:
    def __init__(self, config: EngineConfig, on_outputs: Callable, on_dead: Callable):
        import msgspec
        import zmq

        self._on_outputs, self._on_dead = on_outputs, on_dead
        self._closing = False
        self._dir = tempfile.mkdtemp(prefix="minivllm-core-")
        input_address, output_address = f"ipc://{self._dir}/input", f"ipc://{self._dir}/output"
        self._context = zmq.Context()
        self._push, self._pull = self._context.socket(zmq.PUSH), self._context.socket(zmq.PULL)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.setsockopt(zmq.SNDHWM, 0)  # never drop or refuse a request because many are queued
        self._push.bind(input_address)
        self._pull.bind(output_address)
        self._encoder, self._decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(CoreOutput)
        self._send_lock = threading.Lock()  # a ZMQ socket is not thread-safe; adds and aborts come from any thread
        fields = {k: (str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v)
                  for k, v in dataclasses.asdict(config).items()}
        self.process = subprocess.Popen(
            [sys.executable, "-c", CORE_PROCESS_MAIN, input_address, output_address, json.dumps(fields)],
            stdin=subprocess.PIPE, start_new_session=True)  # Ctrl-C reaches the frontend, which stops the core
        try:
            self.ready = self._wait_ready()
        except BaseException:
            self._close()
            raise
        self._receiver = threading.Thread(target=self._receive, name="minivllm-core-client", daemon=True)
        self._receiver.start()

    def _wait_ready(self) -> EngineCoreReady:
        """Block until the core has built its engine (weights, KV pool, graphs: it can take minutes)."""
        while not self._pull.poll(POLL_MS):
            if self.process.poll() is not None:
                raise CoreStartupError(f"the engine core process exited with code {self.process.returncode} "
                                       "before it was ready (its log is above)")
        message = self._decoder.decode(self._pull.recv())
        if isinstance(message, EngineCoreFailed):
            # A bad configuration (ValueError) stays a ValueError, as with the engine in this process.
            error = {"ValueError": ValueError, "FileNotFoundError": FileNotFoundError}.get(message.error_type)
            raise (error or CoreStartupError)(message.message.removeprefix(f"{message.error_type}: "))
        return message

    def _receive(self) -> None:
        import zmq

        try:
            while not self._closing:
                if not self._pull.poll(POLL_MS):
                    if self.process.poll() is not None and not self._closing:
                        self._on_dead(f"the engine core process exited with code {self.process.returncode}")
                        return
                    continue
                # Every message that has arrived, in one go: a batch of steps then reaches each stream at
                # once, and a stream sends them as one event.
                messages = [self._decoder.decode(frame) for frame in receive_all(self._pull)]
                outputs = [m for m in messages if isinstance(m, EngineCoreOutputs)]
                if outputs:
                    self._on_outputs(outputs)
                failed = next((m for m in messages if isinstance(m, EngineCoreFailed)), None)
                if failed is not None and not self._closing:
                    self._on_dead(f"the engine core failed: {failed.message}")
                    return
        except zmq.ZMQError:
            if not self._closing:
                raise

    def _send(self, message) -> None:
        import zmq

        with self._send_lock:
            if self._closing:
                return
            try:  # never block: a PUSH socket with no peer (the core just died) would wait forever
                self._push.send(self._encoder.encode(message), flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass  # the receiving thread is about to report the core dead; the request's stream hears of it

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self._send(AbortRequests(request_ids))

    def shutdown(self) -> None:
        """Ask the core to stop (it aborts what is left and stops its workers); kill it if it does not."""
        if self.process.poll() is None:
            self._send(Shutdown())
        self._close()

    def _close(self) -> None:
        with self._send_lock:
            self._closing = True
        try:
            self.process.wait(timeout=SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdin is not None:
            self.process.stdin.close()
        receiver = getattr(self, "_receiver", None)
        if receiver is not None and receiver is not threading.current_thread():
            receiver.join()
        self._context.destroy(linger=0)
        shutil.rmtree(self._dir, ignore_errors=True)
