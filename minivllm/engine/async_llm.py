"""AsyncLLM: the engine for online serving, where requests arrive one by one and answers stream.

    >>> engine = AsyncLLM("smollm2-135m")
    >>> async for out in engine.generate("Hello", SamplingParams(max_tokens=8), request_id="r1"):
    ...     print(out.outputs[0].text)         # cumulative: the answer so far; the last has finished=True
    >>> await engine.abort("r1"); engine.get_stats(); engine.shutdown()

`LLMEngine.step()` is blocking work (a whole forward pass on the GPU). Called on the event loop, it
would freeze every connection of the server for the length of a step. So, as vLLM runs its
EngineCore apart from the API server, the engine here lives in a thread of its own that loops:

    take the commands that arrived (add, abort) -> one step -> hand each output to its stream

The event loop and the engine thread meet in two places only: a queue of commands going in, and
one `asyncio.Queue` per request coming out (filled with `call_soon_threadsafe`, the one
thread-safe way into an event loop). The engine's state is touched by its thread alone, so it
needs no lock. A consumer that stops iterating, or is cancelled (a client that hung up), aborts its
request: its KV blocks come back at once.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import threading
from collections.abc import AsyncIterator

from ..config import engine_config
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from .llm_engine import LLMEngine


class EngineDeadError(RuntimeError):
    """The engine thread stopped on an error: no request can be served any more."""


class AsyncLLM:
    def __init__(self, model: str, **engine_args):
        self.llm_engine = LLMEngine(engine_config("AsyncLLM", model, engine_args))
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self.error: BaseException | None = None   # set if the engine thread died
        self._thread = threading.Thread(target=self._engine_loop, name="minivllm-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self):
        return self.llm_engine.tokenizer

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # ---- the event loop's side ---------------------------------------------------------
    async def add_request(self, request_id: str, prompt, sampling_params: SamplingParams | None = None
                          ) -> "RequestStream":
        """Queue a request; returns the stream of its outputs. Bad input raises ValueError here,
        so a server can answer 400 before it starts streaming."""
        if not self.is_running:
            raise EngineDeadError(f"the engine has stopped: {self.error!r}")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        outputs: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), outputs)
        added = concurrent.futures.Future()
        self._commands.put(("add", request_id, prompt, sampling_params, added))
        try:
            await asyncio.wrap_future(added)       # the engine's ValueError for bad input lands here
        except asyncio.CancelledError:             # the caller gave up while the engine was adding it
            self._streams.pop(request_id, None)
            self._commands.put(("abort", request_id))
            raise
        return RequestStream(self, request_id, outputs)

    async def generate(self, prompt, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Cumulative outputs of one request, at least one per step that advanced it; the last has
        `finished=True`. Stopping early (break, cancel) aborts the request."""
        request_id = str(next(self._ids)) if request_id is None else request_id
        stream = await self.add_request(request_id, prompt, sampling_params)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    async def abort(self, request_id: str) -> None:
        """End a request now; its stream (if someone reads it) gets a last output, finish_reason "abort"."""
        self._commands.put(("abort", request_id))

    def _drop(self, stream: "RequestStream") -> None:
        """A stream's reader is gone: nobody hears of the request any more, and the engine ends it. (Unless
        the id already names a newer request, which a client may add once the old one has finished.)"""
        registered = self._streams.get(stream.request_id)
        if registered is not None and registered[1] is stream._outputs:
            del self._streams[stream.request_id]
            self._commands.put(("abort", stream.request_id))

    def get_stats(self) -> dict:
        return self.llm_engine.get_stats()

    def shutdown(self) -> None:
        """Abort what is left, stop the engine thread, then the engine's worker processes if any."""
        if self._thread.is_alive():
            self._commands.put(("stop",))
            self._thread.join()
        self.llm_engine.shutdown()

    # ---- the engine thread's side ------------------------------------------------------
    def _engine_loop(self) -> None:
        engine = self.llm_engine
        try:
            while True:
                # Idle: sleep until a command comes. Busy: take what has come, and step.
                command = self._commands.get() if not engine.has_unfinished_requests() else self._next_command()
                while command is not None:
                    if command[0] == "stop":
                        for request_id in list(engine.requests):
                            self._deliver(engine.abort_request(request_id))
                        return
                    self._handle(command)
                    command = self._next_command()
                if engine.has_unfinished_requests():
                    for out in engine.step():
                        self._deliver(out)
        except BaseException as e:  # a bug, or the GPU gone: every waiting stream hears of it
            self.error = e
            for loop, stream in list(self._streams.values()):
                loop.call_soon_threadsafe(stream.put_nowait, EngineDeadError(f"the engine stopped: {e!r}"))
            self._streams.clear()
            raise

    def _next_command(self):
        try:
            return self._commands.get_nowait()
        except queue.Empty:
            return None

    def _handle(self, command) -> None:
        kind, request_id = command[0], command[1]
        if kind == "add":
            prompt, params, added = command[2:]
            try:
                self.llm_engine.add_request(request_id, prompt, params)
            except Exception as e:  # bad input: this request fails, the engine goes on
                self._streams.pop(request_id, None)
                added.set_exception(e)
            else:
                added.set_result(None)
        elif kind == "abort":
            self._deliver(self.llm_engine.abort_request(request_id))

    def _deliver(self, out: RequestOutput | None) -> None:
        if out is None:
            return
        target = self._streams.pop(out.request_id, None) if out.finished else self._streams.get(out.request_id)
        if target is not None:
            loop, stream = target
            try:
                loop.call_soon_threadsafe(stream.put_nowait, out)
            except RuntimeError:  # that event loop is closed: nobody is listening any more
                pass


class RequestStream:
    """The outputs of one request, as an async iterator; `close()` before the end aborts it."""

    def __init__(self, engine: AsyncLLM, request_id: str, outputs: asyncio.Queue):
        self.engine, self.request_id, self._outputs = engine, request_id, outputs
        self.finished = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        out = await self._outputs.get()
        if isinstance(out, BaseException):
            self.finished = True
            raise out
        self.finished = out.finished
        return out

    def close(self) -> None:
        """Idempotent; called when the reader leaves (a client that hung up, a consumer that broke off)."""
        if not self.finished:
            self.finished = True
            self.engine._drop(self)
