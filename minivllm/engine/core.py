"""EngineCore: the scheduler and the executor, one step at a time; its output is each request's new tokens.

    >>> core = EngineCore.from_config(EngineConfig("smollm2-135m"))
    >>> core.add_request(EngineCoreRequest("a", [1, 2, 3], SamplingParams(max_tokens=4)))
    >>> while core.has_unfinished_requests():
    ...     print(core.step())        # [EngineCoreOutput(request_id, new_token_ids, finish_reason, ...)]

A step: schedule -> execute the model -> sample -> `Scheduler.update_from_output`. With async scheduling
the next step is launched on the GPU before the host waits for this one's tokens (`step`). `LLMEngine`
calls it in its own process; `AsyncLLM` runs it in a process of its own (`EngineCoreProc`, `main`),
fed by ZMQ messages, so that the server's Python and the engine's never wait for each other.
"""
from __future__ import annotations

import contextlib
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

import msgspec
import torch

from ..config import EngineConfig, default_batch_limits, resolve_dtype, resolve_kv_cache_dtype
from ..core.async_scheduler import AsyncScheduler
from ..core.block_manager import BlockManager
from ..core.scheduler import Scheduler, SchedulerOutput
from ..core.sequence import Sequence
from ..distributed.parallel_state import check_divisible, tp_size
from ..executor import Executor, make_executor
from ..models.loader import generation_eos_ids, load_tokenizer, resolve_model
from ..outputs import EngineCoreOutput
from ..spec_decode import DraftSlots
from ..structured_output import StructuredOutputManager
from ..utils import warning_once
from ..worker.model_runner import SampledTokens
from .core_messages import (
    AbortRequests,
    CoreInput,
    EngineCoreFailed,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    RejectedRequest,
    Shutdown,
)
from .input_processor import InputProcessor

logger = logging.getLogger("minivllm.engine.core")
STATS_INTERVAL_S = 0.1  # while busy, /metrics hears from the core at least this often, however long a step


class EngineCore:
    """The scheduler and the executor (plus the grammars that steps need)."""

    def __init__(self, config: EngineConfig, scheduler: Scheduler, executor: Executor,
                 input_processor: InputProcessor, structured_output: StructuredOutputManager | None = None):
        self.config = config
        self.scheduler = scheduler
        self.executor = executor
        self.input_processor = input_processor  # the core checks requests again: a socket is not trusted
        self.structured_output = structured_output
        # The step launched on the GPU whose tokens the host has not read yet (async scheduling).
        self._in_flight: tuple[SchedulerOutput, SampledTokens] | None = None

    @classmethod
    def from_config(cls, config: EngineConfig, usage_context: str = "llm") -> EngineCore:
        """Resolve the model, start the executor, reserve the CUDA graphs' memory, size the KV pool from a
        profiling forward, allocate it, capture the graphs (decode, verify, mixed) and build the scheduler. Limits not
        given are sized by the device for `usage_context` ("llm": offline; "server": `AsyncLLM`)."""
        source = resolve_model(config.model)
        cfg = source.config
        dtype = resolve_dtype(config.dtype, cfg, config.device)
        max_model_len = config.max_model_len or cfg.max_position_embeddings
        if max_model_len > cfg.max_position_embeddings:  # RoPE tables and the model stop there
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's "
                             f"{cfg.max_position_embeddings} positions (max_position_embeddings)")
        default_seqs, default_tokens = default_batch_limits(config.device, usage_context, config.gpu_memory_limit_bytes)
        max_num_batched_tokens = config.max_num_batched_tokens or default_tokens
        max_num_seqs = config.max_num_seqs or default_seqs
        if not config.enable_chunked_prefill:  # a whole prompt must fit in one step
            max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
        prefix_caching = config.enable_prefix_caching is not False and config.enable_paged_kv
        if prefix_caching and cfg.sliding_window is not None:
            # As vLLM did: blocks released outside the window break the chain of cached prefix blocks.
            if config.enable_prefix_caching:  # asked for, explicitly
                warning_once(logger, "prefix caching is turned off for models with a sliding window")
            prefix_caching = False
        block_size = config.block_size if config.enable_paged_kv else max_model_len
        eos_token_ids = generation_eos_ids(cfg, source.folder)

        if tp_size() > 1:  # the layers read the group of this process: it can hold one split model only
            raise RuntimeError("a tensor-parallel engine is running in this process: shut it down "
                               "(LLM.shutdown()) before starting another engine")
        if config.tensor_parallel_size > 1:
            check_divisible(cfg.num_heads, cfg.num_kv_heads, config.tensor_parallel_size)  # before any process
        runner_args = dict(model_config=cfg, device=config.device, dtype=dtype, max_model_len=max_model_len,
                           block_size=block_size, max_num_seqs=max_num_seqs,
                           folder=None if config.load_format == "dummy" else source.folder, seed=config.seed,
                           backend=config.attention_backend, gpu_memory_limit_bytes=config.gpu_memory_limit_bytes,
                           eos_token_ids=tuple(eos_token_ids), quantization=config.quantization,
                           kv_cache_dtype=resolve_kv_cache_dtype(config.kv_cache_dtype, dtype))
        executor = make_executor(runner_args, config.tensor_parallel_size, config.device)
        try:  # a failure from here on stops the workers already started
            spec = config.speculative_config
            if spec is not None:
                executor.add_proposer(spec, runner_args)
            if not config.enforce_eager:
                executor.reserve_graph_memory(max_num_batched_tokens, config.num_speculative_tokens)
            if config.num_kv_blocks is not None:
                num_blocks = config.num_kv_blocks * config.block_size // block_size
            else:  # what fits in kv_cache_memory_bytes, or after a profiling forward
                num_blocks = executor.num_kv_blocks_that_fit(config.gpu_memory_utilization, max_num_batched_tokens,
                                                             config.kv_cache_memory_bytes)
            if num_blocks < 1:
                raise ValueError(f"the KV cache holds less than one block of {block_size} tokens: "
                                 "lower max_model_len or block_size, or give the cache more memory")
            executor.initialize_kv_cache(num_blocks)
            if not config.enforce_eager:
                executor.capture_cuda_graphs(config.num_speculative_tokens)
        except BaseException:
            executor.shutdown()
            raise
        scheduler_class = AsyncScheduler if config.async_scheduling else Scheduler
        scheduler = scheduler_class(BlockManager(num_blocks, block_size, prefix_caching), max_num_seqs,
                                    max_num_batched_tokens, max_model_len, eos_token_ids,
                                    config.enable_chunked_prefill, cfg.sliding_window,
                                    continuous=config.enable_continuous_batching,
                                    spec_decode=DraftSlots(config.num_speculative_tokens, spec.disable_by_batch_size,
                                                           spec.adaptive) if spec else None)
        input_processor = InputProcessor(None, cfg.vocab_size, max_model_len, block_size, num_blocks,
                                         max_num_batched_tokens, cfg.sliding_window)
        # Grammars need the tokenizer's vocabulary: loaded on the first request that asks for one.
        structured_output = StructuredOutputManager(cfg.vocab_size, eos_token_ids,
                                                    lambda: load_tokenizer(source.folder),
                                                    pin_memory=torch.device(config.device).type == "cuda")
        return cls(config, scheduler, executor, input_processor, structured_output)

    # ---- requests ----------------------------------------------------------------------
    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request (ValueError if it cannot run: nothing changes then)."""
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        params = request.sampling_params
        self.input_processor.check(request.prompt_token_ids, params)
        seq = Sequence(request.request_id, request.prompt_token_ids, params, self.config.device)
        if params.structured_outputs is not None:  # compiled now (or found in the cache): never mid-step
            seq.grammar = self.structured_output.grammar_for(params.structured_outputs)
        self.scheduler.add(seq)

    def abort_requests(self, request_ids) -> list[EngineCoreOutput]:
        """End requests wherever they are (waiting, running, in a step in flight); their blocks come back."""
        outputs = []
        for request_id in request_ids:
            seq = self.scheduler.requests.get(request_id)
            if seq is not None:
                self.scheduler.finish(seq, "abort")
                outputs.append(EngineCoreOutput(request_id, [], "abort"))
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    @property
    def requests(self) -> dict[str, Sequence]:
        return self.scheduler.requests

    # ---- one step ----------------------------------------------------------------------
    def step(self) -> list[EngineCoreOutput]:
        """Advance every scheduled request by one step; the new tokens of those that advanced.

        With async scheduling the next step is on the GPU when this returns: each call launches step n+1,
        then waits for step n and returns its outputs (the first call launches two steps)."""
        if not (self.config.async_scheduling and isinstance(self.scheduler, AsyncScheduler)):
            # (A step still in flight, from before async scheduling was turned off, is finished first.)
            launched, self._in_flight = self._in_flight or self._launch()[0], None
            return self._update(launched) if launched else []
        self._discard_stale_step()
        if self._in_flight is None:
            self._in_flight = self._launch()[0]
            if self._in_flight is None:
                return []
        done = self._in_flight
        self._in_flight, outputs = self._launch(done)  # step n+1 is queued before we wait for step n
        if outputs is None:
            outputs = self._update(done)
        self._discard_stale_step()  # e.g. the last requests just ended: nothing is left to wait for
        return outputs

    def _discard_stale_step(self) -> None:
        """Forget the step in flight if every request in it has ended meanwhile (finished, aborted)."""
        if self._in_flight is not None and all(seq.is_finished for seq in self._in_flight[0].seqs):
            self.scheduler.discard_output(self._in_flight[0])
            self._in_flight = None

    def _launch(self, in_flight: tuple[SchedulerOutput, SampledTokens] | None = None
                ) -> tuple[tuple[SchedulerOutput, SampledTokens] | None, list[EngineCoreOutput] | None]:
        """Schedule -> execute -> sample, without waiting for the GPU; returns the step launched (None: nothing
        to run) and, if it had to update from the step `in_flight` first, that step's outputs.

        A row under a grammar may only be sampled once its grammar has accepted the token in flight: then the
        forward is queued, the host updates from the step in flight and fills the grammars' bitmask while the
        GPU runs the forward, and only then samples."""
        scheduler_output = self.scheduler.schedule()
        if not scheduler_output:
            return None, None
        draft_probs = self.executor.propose(scheduler_output)
        logits = self.executor.execute_model(scheduler_output)
        outputs, bitmask, seqs = None, None, scheduler_output.sampled_seqs
        if any(seq.grammar is not None for seq in seqs):
            if in_flight is not None:
                outputs = self._update(in_flight)
            bitmask = self.structured_output.grammar_bitmask(seqs)
        return (scheduler_output, self.executor.sample(logits, scheduler_output, draft_probs, bitmask)), outputs

    def _update(self, launched: tuple[SchedulerOutput, SampledTokens]) -> list[EngineCoreOutput]:
        scheduler_output, sampled = launched
        tokens = sampled.tolist()
        per_row, prompt = sampled.logprobs() or (None, [])
        return self.scheduler.update_from_output(scheduler_output, tokens, per_row, prompt)

    def get_stats(self) -> dict:
        scheduler, blocks = self.scheduler, self.scheduler.blocks
        spec = scheduler.spec_decode
        return {
            "num_total_blocks": blocks.num_total_blocks,
            "num_free_blocks": blocks.num_free_blocks,   # cached-but-unused blocks count as free
            "num_running": len(scheduler.running),
            "num_waiting": len(scheduler.waiting),
            "num_preemptions": scheduler.num_preemptions,
            "num_prefix_cache_hit_tokens": scheduler.num_prefix_cache_hit_tokens,
            "num_generation_tokens": scheduler.num_generation_tokens,
            "num_drafts": spec.num_drafts if spec else 0,
            "num_draft_tokens": spec.num_draft_tokens if spec else 0,
            "num_accepted_tokens": spec.num_accepted_tokens if spec else 0,
        }

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do with one rank)."""
        self.executor.shutdown()


def make_engine_core(config: EngineConfig) -> EngineCore:
    """The core of a server, in the process (or thread) that holds the GPU."""
    if torch.device(config.device).type == "cuda":
        # The core's host-side tensors are tiny: one intra-op thread is fastest, and it leaves the other
        # cores to the frontend (torch's default of one thread per core keeps them spinning).
        torch.set_num_threads(1)
    return EngineCore.from_config(config, usage_context="server")


def freeze_startup_objects() -> None:
    """Move every object alive now (the model, the modules) out of the garbage collector's sight, so a full
    collection does not pause the busy loop (vLLM does the same after startup). `unfreeze_startup_objects`
    gives them back at shutdown."""
    gc.collect()
    gc.freeze()


def unfreeze_startup_objects() -> None:
    """At shutdown: a frozen object is never freed, not even when the interpreter exits, and Triton's
    extension (nanobind) reports each of its objects still alive then as a leak, some 30 lines on stderr."""
    gc.unfreeze()


@contextlib.contextmanager
def startup_objects_frozen():
    """The same for the length of a `with` block (`LLM.generate`'s loop): the objects alive when it starts are
    frozen without a collection first, and given back, garbage included, when it ends (both O(1)). Nothing
    changes where objects are frozen already."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class EngineCoreProc:
    """The busy loop around an `EngineCore`: messages come from `inputs`, each step's outputs go to `send`."""

    def __init__(self, core: EngineCore, inputs: queue.SimpleQueue, send: Callable[[object], None]):
        self.core, self.inputs, self.send = core, inputs, send
        self._last_sent = time.monotonic()

    def ready_message(self) -> EngineCoreReady:
        core, scheduler = self.core, self.core.scheduler
        return EngineCoreReady(core.input_processor.vocab_size, scheduler.max_model_len, scheduler.blocks.block_size,
                               scheduler.blocks.num_total_blocks, scheduler.max_num_batched_tokens,
                               core.input_processor.sliding_window, core.get_stats(), scheduler.max_num_seqs)

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
        self.send(EngineCoreOutputs(outputs, self.core.get_stats(), rejected))

    def _report_stats_while_busy(self, done: threading.Event) -> None:
        """During a long step, send the stats alone now and then, so the gauges of /metrics stay current.
        It only reads counters that the GIL keeps whole."""
        while not done.wait(STATS_INTERVAL_S):
            if self.core.has_unfinished_requests() and time.monotonic() - self._last_sent >= STATS_INTERVAL_S:
                self._report([], [])

    def _loop(self) -> None:
        core = self.core
        while True:
            # Idle: block until a message comes. Busy: only take what is already there.
            message = self.inputs.get() if not core.has_unfinished_requests() else self._next_message()
            outputs: list[EngineCoreOutput] = []
            rejected: list[RejectedRequest] = []
            while message is not None:
                if isinstance(message, Shutdown):
                    self._report(outputs + core.abort_requests(list(core.scheduler.requests)), rejected)
                    return
                self._handle(message, outputs, rejected)
                message = self._next_message()
            if core.has_unfinished_requests():
                outputs += core.step()
            self._report(outputs, rejected)

    def _next_message(self) -> CoreInput | RejectedRequest | None:
        try:
            return self.inputs.get_nowait()
        except queue.Empty:
            return None

    def _handle(self, message, outputs: list, rejected: list) -> None:
        if isinstance(message, EngineCoreRequest):
            try:
                self.core.add_request(message)
            except ValueError as e:
                rejected.append(RejectedRequest(message.request_id, str(e)))
        elif isinstance(message, AbortRequests):
            outputs += self.core.abort_requests(message.request_ids)
        elif isinstance(message, RejectedRequest):  # refused while decoding (a bad sampling value)
            rejected.append(message)


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
    import zmq

    decoder = msgspec.msgpack.Decoder(CoreInput)
    request_id_of = msgspec.msgpack.Decoder(_RequestId)
    while True:
        try:
            frames = receive_all(socket)
        except zmq.ContextTerminated:  # the process is ending
            socket.close()
            return
        for frame in frames:
            try:
                message = decoder.decode(frame)
            except msgspec.ValidationError as e:  # a request with a bad value is refused under its id
                try:
                    message = RejectedRequest(request_id_of.decode(frame).request_id, str(e))
                except msgspec.DecodeError:
                    logger.warning("engine core: dropped a malformed message (%d bytes): %s", len(frame), e)
                    continue
            except msgspec.DecodeError as e:
                logger.warning("engine core: dropped a malformed message (%d bytes): %s", len(frame), e)
                continue
            inputs.put(message)


class _RequestId(msgspec.Struct, tag="add"):
    request_id: str


def _send(socket, outbox: queue.SimpleQueue) -> None:
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
    """The core process's life: connect, build the core, report ready, loop. Returns the exit code."""
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
    code, core = 0, None
    try:
        core = make_engine_core(config)
        freeze_startup_objects()
        proc = EngineCoreProc(core, inputs, outbox.put)
        outbox.put(proc.ready_message())
        proc.run_busy_loop()
    except BaseException as e:  # noqa: BLE001 - any failure is reported, then the process exits non-zero
        logger.error("engine core failed:\n%s", traceback.format_exc())
        outbox.put(EngineCoreFailed(type(e).__name__, f"{type(e).__name__}: {e}"))
        code = 1
    finally:
        if core is not None:
            core.shutdown()
        unfreeze_startup_objects()
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

