"""The output processor: the engine core's new token ids become `RequestOutput`s, for `LLM` and `AsyncLLM` alike.

Per request it detokenizes incrementally, matches stop strings (a match ends the output and the core is
told to abort that request), decodes logprobs, and gathers the n completions of a request with
`SamplingParams.n > 1`: the core runs them as n requests (`{i}_{request_id}`, seed + i), which share their
full prompt blocks through the prefix cache (vLLM's ParentRequest). `LLMEngine` takes the outputs it
returns; `AsyncLLM` gives each request a `RequestStream` instead, which builds an output when read.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import time

from ..core.detokenizer import IncrementalDetokenizer
from ..outputs import CompletionOutput, EngineCoreOutput, Logprob, LogprobArrays, RequestMetrics, RequestOutput
from ..sampling_params import RequestOutputKind, SamplingParams
from .core_messages import EngineCoreRequest


class CompletionState:
    """One completion of a request (one of n): its token ids, text and logprobs so far."""

    def __init__(self, index: int, core_id: str, prompt_token_ids: list[int], params: SamplingParams, tokenizer):
        self.index, self.core_id = index, core_id
        self.token_ids: list[int] = []
        self.logprobs: list[dict] | None = [] if params.logprobs is not None else None
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, params.stop) if tokenizer else None
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return self.detokenizer.text if self.detokenizer is not None else ""

    def update(self, out: EngineCoreOutput, decode) -> bool:
        """Take one step's new tokens; True if a stop string ended the completion here (the core must abort)."""
        if self.finish_reason is not None:  # (a stop string ended it; the core's last tokens come after)
            return False
        stopped = False
        for i, token_id in enumerate(out.new_token_ids):
            self.token_ids.append(token_id)
            if self.logprobs is not None and out.new_logprobs is not None:
                self.logprobs.append(decode(out.new_logprobs[i]))
            if self.detokenizer is not None and self.detokenizer.add(token_id):
                stopped = True  # the text ends before the stop string; later tokens are not part of the output
                break
        if self.finish_reason is None and (stopped or out.finish_reason is not None):
            self.finish_reason = "stop" if stopped else out.finish_reason
        return stopped and out.finish_reason is None

    def snapshot(self) -> tuple:
        return len(self.token_ids), len(self.text), self.finish_reason

    def output(self, snapshot, since=(0, 0, None)) -> CompletionOutput:
        """The completion as of `snapshot`; only what came after `since` (an earlier snapshot) for DELTA."""
        (num_tokens, text_len, finish_reason), (first, start, _) = snapshot, since
        logprobs = self.logprobs[first:num_tokens] if self.logprobs is not None else None
        return CompletionOutput(self.index, self.text[start:text_len], self.token_ids[first:num_tokens], finish_reason,
                                logprobs)


class RequestState:
    """One live request: its n completions (one unless SamplingParams.n > 1) and, with AsyncLLM, its stream."""

    def __init__(self, request_id: str, core_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, tokenizer, loop: asyncio.AbstractEventLoop | None = None):
        self.request_id, self.prompt, self.prompt_token_ids, self.params = request_id, prompt, prompt_token_ids, params
        core_ids = [core_id] if params.n == 1 else [f"{i}_{core_id}" for i in range(params.n)]
        self.completions = [CompletionState(i, c, prompt_token_ids, params, tokenizer) for i, c in enumerate(core_ids)]
        self.prompt_logprobs: list[dict | None] | None = [None] if params.prompt_logprobs is not None else None
        self.metrics = RequestMetrics(arrival_time=time.perf_counter())
        self.sent = None  # the snapshot of the last output made (DELTA outputs start after it)
        self.loop = loop
        self.stream = RequestStream(self) if loop is not None else None

    def core_requests(self) -> list[EngineCoreRequest]:
        """What the core runs: one request per completion; completion i samples with seed + i, and only the
        first computes prompt logprobs (the others may then take the prompt from the prefix cache)."""
        if self.params.n == 1:
            return [EngineCoreRequest(self.completions[0].core_id, self.prompt_token_ids, self.params)]
        p = self.params
        return [EngineCoreRequest(c.core_id, self.prompt_token_ids, dataclasses.replace(
                    p, n=1, seed=None if p.seed is None else p.seed + c.index,
                    prompt_logprobs=p.prompt_logprobs if c.index == 0 else None))
                for c in self.completions]

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.completions)

    def snapshot(self) -> tuple:
        return tuple(c.snapshot() for c in self.completions)

    def output(self, snapshot) -> RequestOutput:
        """The request's output as of `snapshot` (for DELTA, what is new since the last output made)."""
        delta = self.params.output_kind == RequestOutputKind.DELTA
        since = self.sent if delta and self.sent is not None else [(0, 0, None)] * len(snapshot)
        completions = [c.output(s, f) for c, s, f in zip(self.completions, snapshot, since)]
        prompt_logprobs = list(self.prompt_logprobs) if self.prompt_logprobs is not None else None
        if delta and self.sent is not None:
            prompt_logprobs = None  # given with the first output
        self.sent = snapshot
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, completions,
                             all(c.finish_reason is not None for c in completions), self.metrics, prompt_logprobs)


class RequestStream:
    """The outputs of one request, as an async iterator; `close()` before the end aborts it.

    It queues small snapshots (tokens, text length, finish reason) and builds a `RequestOutput` when its reader
    asks. `merged()` yields only the newest, so a reader slower than the engine gets one output with everything
    new since its last read (vLLM's RequestOutputCollector)."""

    def __init__(self, state: RequestState):
        self.state, self.request_id = state, state.request_id
        self._pending: collections.deque = collections.deque()   # snapshots, or the exception that ends it
        self._ready = asyncio.Event()
        self.finished = False
        self.on_close = None   # set by AsyncLLM: what closing early does (abort the request)

    def put(self, item, finished: bool = True) -> None:
        """A snapshot (`finished`: the request's last) or an exception; called on the event loop's thread."""
        if not finished and self.state.params.output_kind == RequestOutputKind.FINAL_ONLY:
            return
        self._pending.append(item)
        self._ready.set()

    async def _wait(self) -> None:
        while not self._pending:
            self._ready.clear()
            await self._ready.wait()

    def _take(self, item) -> RequestOutput:
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        out = self.state.output(item)
        self.finished = out.finished
        return out

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        """Every step's output, in order."""
        if self.finished:
            raise StopAsyncIteration
        await self._wait()
        return self._take(self._pending.popleft())

    async def merged(self):
        """The newest output each time the reader comes back (outputs are cumulative: it holds the others)."""
        while not self.finished:
            await self._wait()
            errors = [item for item in self._pending if isinstance(item, BaseException)]
            item = errors[0] if errors else self._pending[-1]
            self._pending.clear()
            yield self._take(item)

    def close(self) -> None:
        """Idempotent; called when the reader leaves (a client that hung up, a consumer that broke off)."""
        if not self.finished:
            self.finished = True
            if self.on_close is not None:
                self.on_close(self)


class OutputProcessor:
    """The live requests, and what each step's `EngineCoreOutput`s do to them."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}    # by the caller's request id
        self._by_core_id: dict[str, tuple[RequestState, CompletionState]] = {}

    def add_request(self, state: RequestState) -> list[EngineCoreRequest]:
        """Track a request; returns what to send to the core."""
        self.requests[state.request_id] = state
        for c in state.completions:
            self._by_core_id[c.core_id] = (state, c)
        return state.core_requests()

    def remove(self, state: RequestState) -> None:
        if self.requests.get(state.request_id) is state:
            del self.requests[state.request_id]
        for c in state.completions:
            if self._by_core_id.get(c.core_id, (None,))[0] is state:
                del self._by_core_id[c.core_id]

    def core_ids(self, state: RequestState) -> list[str]:
        return [c.core_id for c in state.completions if c.finish_reason is None]

    def process_outputs(self, outputs: list[EngineCoreOutput], loop=None) -> tuple[list[RequestOutput], list[str]]:
        """Apply one step's outputs (those of `loop`'s requests, with AsyncLLM). Returns the outputs of the
        requests without a stream that advanced, and the core ids to abort (stop strings)."""
        to_abort, advanced = [], {}
        for out in outputs:
            state, completion = self._by_core_id.get(out.request_id, (None, None))
            if state is None or state.loop is not loop:  # aborted meanwhile, or another event loop's
                continue
            if completion.update(out, self._logprobs):
                to_abort.append(completion.core_id)
            if out.new_prompt_logprobs is not None and state.prompt_logprobs is not None:
                state.prompt_logprobs += [self._logprobs(arrays) for arrays in out.new_prompt_logprobs]
            advanced[id(state)] = state
        request_outputs, now = [], time.perf_counter()
        for state in advanced.values():
            finished = state.finished
            if state.metrics.first_token_time is None and any(c.token_ids for c in state.completions):
                state.metrics.first_token_time = now
            if finished:
                state.metrics.finished_time = now
                self.remove(state)
            if state.stream is not None:
                state.stream.put(state.snapshot(), finished)
            elif finished or (state.params.output_kind != RequestOutputKind.FINAL_ONLY
                              and any(c.token_ids for c in state.completions)):
                request_outputs.append(state.output(state.snapshot()))
        return request_outputs, to_abort

    def finish(self, state: RequestState, reason: str) -> RequestOutput | None:
        """End a request here (aborted, or the engine stopped); its last output (or, with a stream, its
        reader gets it)."""
        out = None
        if not state.finished:
            for c in state.completions:
                c.finish_reason = c.finish_reason or reason
            state.metrics.finished_time = time.perf_counter()
            if state.stream is not None:
                state.stream.put(state.snapshot())
            else:
                out = state.output(state.snapshot())
        self.remove(state)
        return out

    def reject(self, core_id: str, message: str, loop=None) -> None:
        """The core refused a request: its stream raises ValueError."""
        state, _ = self._by_core_id.get(core_id, (None, None))
        if state is not None and state.loop is loop:
            if state.stream is not None:
                state.stream.put(ValueError(message))
            self.remove(state)

    def _logprobs(self, arrays: LogprobArrays) -> dict[int, Logprob]:
        """One position's arrays -> vLLM's dict, each token decoded alone (decoded_token)."""
        decode = self.tokenizer.decode if self.tokenizer is not None else None
        ids, logprobs, ranks = arrays
        return {t: Logprob(lp, r, decode([t]) if decode else None) for t, lp, r in zip(ids, logprobs, ranks)}
