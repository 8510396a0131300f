"""EngineCore: the scheduler and the model runner in a busy loop, fed by messages, in a process of its own.

    main([INPUT_ADDRESS, OUTPUT_ADDRESS, CONFIG_JSON])     (started by AsyncLLM, in a child process)

Why a process. A server's frontend (HTTP, JSON, tokenizing, detokenizing, one event per token per
client) is Python, and so is the engine's step loop around the GPU. In one process they take turns
on the GIL: while uvicorn writes a thousand SSE events, the GPU waits for its next step, and while
the engine prepares a step, no client hears anything. vLLM measured it (the API server took a third
of a step) and answered with its V1 architecture: `EngineCore` in its own process, talking to the
frontend over ZMQ. So does minivllm. The two processes then run truly in parallel, on two cores.

The loop (`EngineCore.run_busy_loop`):

    idle: sleep until a message comes      busy: take what has come (adds, aborts), then one step
    -> one `EngineCoreOutputs` message per step: every request's new token ids, finish reasons, stats
       (and, during a step longer than STATS_INTERVAL_S, the stats alone, so /metrics stays current)

Socket I/O runs in two threads of this process, as in vLLM: one receives and decodes (a message
that does not decode as one of the typed structs is logged and dropped: nothing that arrives is
trusted or unpickled), one encodes and sends, so neither ever delays the next step by more than a
queue operation. The core does no text work: the frontend tokenizes, detokenizes and matches stop
strings, and sends an abort when a stop string ends a request.

`AsyncLLM(..., engine_core_process=False)` runs this same loop in a thread of the server's process
instead (the ablation): the messages are then handed over in memory, not encoded.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable

import torch

from ..config import EngineConfig
from ..outputs import RequestOutput
from .core_messages import (
    AbortRequests,
    CoreInput,
    EngineCoreFailed,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    RejectedRequest,
    Shutdown,
)
from .llm_engine import LLMEngine

logger = logging.getLogger("minivllm.engine.core")
STATS_INTERVAL_S = 0.1  # while busy, /metrics hears from the core at least this often, however long a step


def make_engine(config: EngineConfig) -> LLMEngine:
    """The engine a core runs: no tokenizer (the frontend does the text), in the process holding the GPU."""
    if torch.device(config.device).type == "cuda":
        # On a GPU the core's host-side tensors are tiny (a step's ids, positions, block tables), so one
        # intra-op thread is fastest. torch's default, one per core, kept about 14 OpenMP threads spinning
        # between those ops, and they took the cores the frontend and the load needed: on the H200, W3 with
        # all 1000 requests at once went from 9.9k to 15.3k output tok/s served (scripts/gpu_engine_core.sh).
        torch.set_num_threads(1)
    return LLMEngine.from_config(config, detokenize=False)


def freeze_startup_objects() -> None:
    """Move every object alive now (the model, the engine, the imported modules: millions of them) out
    of the garbage collector's sight. Python's full collections walk every tracked object; while the
    busy loop runs, one would pause it for tens of milliseconds, a hiccup in every stream. vLLM does
    the same after startup."""
    gc.collect()
    gc.freeze()


class EngineCore:
    """The busy loop around an `LLMEngine`; messages come from `inputs`, results go to `send`."""

    def __init__(self, engine: LLMEngine, inputs: queue.SimpleQueue, send: Callable[[object], None]):
        self.engine, self.inputs, self.send = engine, inputs, send
        self._num_sent: dict[tuple[str, int], tuple[int, bool]] = {}  # per live answer: tokens reported, done
        self._last_sent = time.monotonic()

    def ready_message(self) -> EngineCoreReady:
        e = self.engine
        return EngineCoreReady(e.model_config.vocab_size, e.max_model_len, e.block_size,
                               e.block_manager.num_total_blocks, e.max_num_batched_tokens,
                               e.model_config.sliding_window, e.get_stats(), e.scheduler.max_num_seqs)

    def run_busy_loop(self) -> None:
        """Until a Shutdown message: take the messages that arrived, step if there is work, report."""
        done = threading.Event()
        reporter = threading.Thread(target=self._report_stats_while_busy, args=(done,), daemon=True,
                                    name="minivllm-core-stats")
        reporter.start()
        try:
            self._loop()
        finally:
            done.set()
            reporter.join()

    def _report(self, outputs: list, rejected: list) -> None:
        self._last_sent = time.monotonic()
        self.send(EngineCoreOutputs(outputs, self.engine.get_stats(), rejected))

    def _report_stats_while_busy(self, done: threading.Event) -> None:
        """A step can take seconds (a long prefill on a CPU, a big batch): meanwhile the gauges of
        /metrics (running, waiting, KV usage) would show the last step's numbers. So, between steps'
        messages, this thread sends the stats alone. It only reads counters (len of the scheduler's
        queues, the free blocks) that the GIL keeps whole; two of them may be a moment apart."""
        while not done.wait(STATS_INTERVAL_S):
            if self.engine.has_unfinished_requests() and time.monotonic() - self._last_sent >= STATS_INTERVAL_S:
                self._report([], [])

    def _loop(self) -> None:
        engine = self.engine
        while True:
            # Idle: block until a message comes. Busy: only take what is already there.
            message = self.inputs.get() if not engine.has_unfinished_requests() else self._next_message()
            outputs: list[EngineCoreOutput] = []
            rejected: list[RejectedRequest] = []
            while message is not None:
                if isinstance(message, Shutdown):
                    for request_id in list(engine.requests):
                        if (out := engine.abort_request(request_id)) is not None:  # (n > 1: answers' ids too)
                            outputs.extend(self._news(out))
                    self._report(outputs, rejected)
                    return
                self._handle(message, outputs, rejected)
                message = self._next_message()
            if engine.has_unfinished_requests():
                outputs.extend(news for out in engine.step() for news in self._news(out))
            self._report(outputs, rejected)

    def _next_message(self) -> CoreInput | None:
        try:
            return self.inputs.get_nowait()
        except queue.Empty:
            return None

    def _handle(self, message: CoreInput, outputs: list, rejected: list) -> None:
        if isinstance(message, EngineCoreRequest):
            try:  # checked again here (the frontend checked first): a socket is not trusted
                self.engine.add_request(message.request_id, message.prompt_token_ids, message.sampling_params())
            except ValueError as e:
                rejected.append(RejectedRequest(message.request_id, str(e)))
        elif isinstance(message, AbortRequests):
            for request_id, index in [(r, None) for r in message.request_ids] + message.answers:
                out = self.engine.abort_request(request_id, index)
                if out is not None:
                    outputs.extend(self._news(out))

    def _news(self, out: RequestOutput) -> list[EngineCoreOutput]:
        """Per answer of `out`, the tokens not reported yet (with the overlap, an output may carry none); an
        answer already reported finished is not reported again."""
        news = []
        for answer in out.outputs:
            key = (out.request_id, answer.index)
            sent, reported_done = self._num_sent.get(key, (0, False))
            if reported_done:
                continue
            self._num_sent[key] = (len(answer.token_ids), answer.finish_reason is not None)
            logprobs = answer.logprobs
            if logprobs is not None:  # arrays on the wire, not dicts of objects
                logprobs = [(list(d), [lp.logprob for lp in d.values()], [lp.rank for lp in d.values()])
                            for d in logprobs[sent:]]
            news.append(EngineCoreOutput(out.request_id, answer.token_ids[sent:], answer.finish_reason, logprobs,
                                         answer.index))
        if out.finished:
            for answer in out.outputs:
                del self._num_sent[(out.request_id, answer.index)]
        return news


# ---- the core's process ----------------------------------------------------------------
def receive_all(socket) -> list[bytes]:
    """Wait for one frame, then take every frame already queued, without blocking. Both ends use it: a
    thread that comes back from a blocking call waits for the GIL (up to the interpreter's 5 ms switch
    interval while another thread runs Python), and one wait per message would let 1000 requests sent at
    once trickle into the core over seconds, or a frontend busy writing events fall behind the core."""
    import zmq

    frames = [socket.recv()]
    while True:
        try:
            frames.append(socket.recv(zmq.NOBLOCK))
        except zmq.Again:
            return frames


def _receive(socket, inputs: queue.SimpleQueue) -> None:
    import msgspec
    import zmq

    decoder = msgspec.msgpack.Decoder(CoreInput)
    while True:
        try:
            frames = receive_all(socket)
        except zmq.ContextTerminated:  # the process is ending
            socket.close()
            return
        for frame in frames:
            try:
                message = decoder.decode(frame)
            except msgspec.DecodeError as e:  # ValidationError is a DecodeError too
                logger.warning("engine core: dropped a malformed message (%d bytes): %s", len(frame), e)
                continue
            inputs.put(message)


def _send(socket, outbox: queue.SimpleQueue) -> None:
    import msgspec

    encoder = msgspec.msgpack.Encoder()
    while (message := outbox.get()) is not None:
        socket.send(encoder.encode(message), copy=False)


def _exit_when_frontend_is_gone() -> None:
    """The frontend holds our stdin: end of file means it has exited (even SIGKILLed). Leave too;
    tensor-parallel workers watch this process the same way."""
    while os.read(sys.stdin.fileno(), 4096):  # the raw fd: a buffered reader's lock would trouble the exit
        pass
    os._exit(1)


def run_engine_core(input_address: str, output_address: str, config: EngineConfig) -> int:
    """The core process's life: connect, build the engine, report ready, loop. Returns the exit code."""
    import zmq

    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 5000)  # a last message (a failure) still leaves before the process does
    pull.connect(input_address)
    push.connect(output_address)
    inputs: queue.SimpleQueue = queue.SimpleQueue()
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    receiver = threading.Thread(target=_receive, args=(pull, inputs), name="minivllm-core-receive")
    sender = threading.Thread(target=_send, args=(push, outbox), name="minivllm-core-send")
    receiver.start()
    sender.start()
    code, engine = 0, None
    try:
        engine = make_engine(config)
        freeze_startup_objects()
        core = EngineCore(engine, inputs, outbox.put)
        outbox.put(core.ready_message())
        core.run_busy_loop()
    except BaseException as e:  # noqa: BLE001 - any failure is reported, then the process exits non-zero
        logger.error("engine core failed:\n%s", traceback.format_exc())
        outbox.put(EngineCoreFailed(type(e).__name__, f"{type(e).__name__}: {e}"))
        code = 1
    finally:
        if engine is not None:
            engine.shutdown()
        outbox.put(None)
        sender.join()
        push.close()
        context.term()  # waits (up to the linger) for the last messages; ends the receiver's recv
        receiver.join()
    return code


def main(argv: list[str]) -> None:
    input_address, output_address, config_json = argv
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    threading.Thread(target=_exit_when_frontend_is_gone, name="minivllm-core-parent", daemon=True).start()
    sys.exit(run_engine_core(input_address, output_address, EngineConfig(**json.loads(config_json))))

