"""AsyncLLM: the engine for online serving, where requests arrive one by one and answers stream.

    >>> engine = AsyncLLM("smollm2-135m")
    >>> async for out in engine.generate("Hello", SamplingParams(max_tokens=8), request_id="r1"):
    ...     print(out.outputs[0].text)         # cumulative: the answer so far; the last has finished=True
    >>> await engine.abort("r1"); engine.get_stats(); engine.shutdown()

Two halves, as in vLLM's V1 engine:

- the engine core (scheduler, model runner, tensor-parallel workers), in a process of its own
  (`core.py`): it steps as fast as the GPU allows and sends each step's token ids;
- the frontend, here, on the server's event loop: it checks and tokenizes requests
  (`InputProcessor`), turns the core's token ids into text and streams (`OutputProcessor`), and
  asks the core to abort a request whose client left or whose stop string appeared.

They meet through `MPClient`: ZMQ sockets and one receiving thread, which hands the steps' messages
that have arrived to the event loop with one `call_soon_threadsafe` (not one per request). With
`engine_core_process=False` the same core loop runs in a thread of this process instead
(`InprocClient`, the ablation): then the engine's Python and the server's Python share one GIL.

A consumer that stops iterating, or is cancelled (a client that hung up), aborts its request: its KV
blocks come back at once. If the core dies, every open stream raises `EngineDeadError`.
"""
from __future__ import annotations

import asyncio
import itertools
import weakref
from collections.abc import AsyncIterator

from ..config import engine_config
from ..models.loader import load_tokenizer, resolve_model
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from .core_client import InprocClient, MPClient
from .core_messages import EngineCoreOutputs
from .input_processor import InputProcessor
from .output_processor import OutputProcessor, RequestState, RequestStream


class EngineDeadError(RuntimeError):
    """The engine core stopped on an error: no request can be served any more."""


class AsyncLLM:
    def __init__(self, model: str, engine_core_process: bool = True, **engine_args):
        config = engine_config("AsyncLLM", model, engine_args)
        self.tokenizer = load_tokenizer(resolve_model(config.model).folder)  # before the core: it may build the folder
        self.output_processor = OutputProcessor(self.tokenizer)
        self.error: EngineDeadError | None = None   # set if the engine core died
        self._stopped = False
        self._ids = itertools.count()
        self._loops: weakref.WeakSet = weakref.WeakSet()   # event loops with requests (tests run several)
        client = MPClient if engine_core_process else InprocClient
        self.engine_core = client(config, self._on_core_outputs, self._on_core_dead)
        ready = self.engine_core.ready
        self._stats = dict(ready.stats)
        self.max_model_len, self.max_num_seqs = ready.max_model_len, ready.max_num_seqs
        self.input_processor = InputProcessor(self.tokenizer, ready.vocab_size, ready.max_model_len, ready.block_size,
                                              ready.num_total_blocks, ready.max_num_batched_tokens,
                                              ready.sliding_window)

    @property
    def llm_engine(self):
        """The `EngineCore` when it runs in this process (`engine_core_process=False`). With the core in
        its own process, this object stands for it: `requests`, `get_stats()`, `max_model_len`."""
        return self.engine_core.core if isinstance(self.engine_core, InprocClient) else self

    @property
    def requests(self) -> dict[str, RequestState]:
        """Requests not finished yet, by id, as the frontend sees them."""
        return self.output_processor.requests

    @property
    def is_running(self) -> bool:
        return self.error is None and not self._stopped

    # ---- the event loop's side ---------------------------------------------------------
    async def add_request(self, request_id: str, prompt, sampling_params: SamplingParams | None = None
                          ) -> RequestStream:
        """Queue a request; returns the stream of its outputs. Bad input raises ValueError here,
        so a server can answer 400 before it starts streaming."""
        if not self.is_running:
            raise EngineDeadError(f"the engine has stopped: {self.error or 'shut down'}")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, token_ids, params = self.input_processor.process(prompt, sampling_params)
        if params.prompt_logprobs is not None:  # not carried between the core and the frontend
            raise ValueError("prompt_logprobs is supported offline only (LLM, LLMEngine), not by AsyncLLM")
        if params.n > self.max_num_seqs:
            raise ValueError(f"n={params.n} completions do not fit in max_num_seqs={self.max_num_seqs}")
        loop = asyncio.get_running_loop()
        self._loops.add(loop)
        # The core sees a unique id: a client may reuse its id once a request has finished here,
        # while the core's last messages about the old one are still on their way.
        state = RequestState(request_id, f"{request_id}#{next(self._ids)}", text, token_ids, params,
                             self.tokenizer, loop)
        state.stream.on_close = self._drop
        for request in self.output_processor.add_request(state):
            self.engine_core.add_request(request)
        return state.stream

    async def generate(self, prompt, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Cumulative outputs of one request, one per step that advanced it; the last has
        `finished=True`. Stopping early (break, cancel) aborts the request."""
        request_id = f"gen-{next(self._ids)}" if request_id is None else request_id
        stream = await self.add_request(request_id, prompt, sampling_params)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    async def abort(self, request_id: str) -> None:
        """End a request now; its stream (if someone reads it) gets a last output, finish_reason "abort"."""
        state = self.requests.get(request_id)
        if state is not None:
            core_ids = self.output_processor.core_ids(state)
            self.output_processor.finish(state, "abort")
            self.engine_core.abort_requests(core_ids)

    def _drop(self, stream: RequestStream) -> None:
        """A stream's reader is gone: nobody hears of the request any more, and the core ends it. (Unless
        the id already names a newer request, which a client may add once the old one has finished.)"""
        state = stream.state
        if self.requests.get(state.request_id) is state:
            core_ids = self.output_processor.core_ids(state)
            self.output_processor.remove(state)
            self.engine_core.abort_requests(core_ids)

    def get_stats(self) -> dict:
        """The engine's numbers (LLMEngine.get_stats), as of the core's latest message."""
        return dict(self._stats)

    def shutdown(self) -> None:
        """End what is left (each open stream gets a last output, "abort"), stop the core and its workers."""
        if self._stopped:
            return
        self._stopped = True
        for state in list(self.requests.values()):
            self._on_loop(state.loop, self.output_processor.finish, state, "abort")
        self.engine_core.shutdown()

    # ---- the core client's thread ------------------------------------------------------
    def _on_core_outputs(self, messages: list[EngineCoreOutputs]) -> None:
        self._stats = messages[-1].stats
        messages = [m for m in messages if m.outputs or m.rejected]  # not the stats alone, sent during a long step
        if not messages:
            return
        for loop in list(self._loops):
            self._on_loop(loop, self._process_outputs, messages, loop)

    def _process_outputs(self, messages: list[EngineCoreOutputs], loop) -> None:
        to_abort = []
        for m in messages:
            to_abort += self.output_processor.process_outputs(m.outputs, loop)[1]
            for rejected in m.rejected:
                self.output_processor.reject(rejected.request_id, rejected.message, loop)
        if to_abort:  # stop strings: the core stops generating what nobody will read
            self.engine_core.abort_requests(to_abort)

    def _on_core_dead(self, reason: str) -> None:
        self.error = EngineDeadError(reason)
        for state in list(self.requests.values()):
            self._on_loop(state.loop, self._fail, state)

    def _fail(self, state: RequestState) -> None:
        state.stream.put(self.error)
        self.output_processor.remove(state)

    @staticmethod
    def _on_loop(loop, callback, *args) -> None:
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # that event loop is closed: nobody is listening there any more
            pass
