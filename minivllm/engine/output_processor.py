"""The frontend's half of every request: its token ids, its text, its stop strings, its stream.

The engine core sends token ids only. Here, in the server's process, each step's ids become what a
client reads: the text grows by incremental detokenization, a stop string ends the answer (and the
frontend tells the core to abort the request: at most one step of tokens is wasted), and the
request's `RequestStream` gets one more output.

A stream never queues whole outputs. It queues small snapshots (how many tokens, how long the text,
finished or not) and builds the `RequestOutput` when its reader asks. `async for` on a stream
yields one output per step, as the contract says; `RequestStream.merged()` yields only the newest,
so a client that reads slower than the engine generates gets one event with everything new since
its last read (vLLM's RequestOutputCollector), not a backlog of events, one per token.
"""
from __future__ import annotations

import asyncio
import collections
import time

from ..core.detokenizer import IncrementalDetokenizer
from ..outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from ..sampling_params import SamplingParams
from .core_messages import EngineCoreOutputs


class AnswerState:
    """One answer of a request (n > 1: one of n) as the frontend builds it: ids, text, logprobs."""

    def __init__(self, index: int, prompt_token_ids: list[int], params: SamplingParams, tokenizer):
        self.index = index
        self.token_ids: list[int] = []
        self.logprobs: list[dict] | None = [] if params.logprobs is not None else None  # one per token
        self.tokenizer = tokenizer
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, params.stop) if tokenizer else None
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return self.detokenizer.text if self.detokenizer is not None else ""

    def update(self, new_token_ids: list[int], finish_reason: str | None, new_logprobs=None) -> bool:
        """Take one step's news; True if a stop string ended the answer here (the core must abort it).
        `new_logprobs`: the core's arrays (ids, logprobs, ranks) per new token, when the request asks."""
        stopped = False
        for i, token_id in enumerate(new_token_ids):
            self.token_ids.append(token_id)
            if self.logprobs is not None and new_logprobs is not None:
                self.logprobs.append(self._logprobs(*new_logprobs[i]))
            if self.detokenizer is not None and self.detokenizer.add(token_id):
                stopped = True  # the text ends before the stop string; later tokens are not part of the answer
                break
        if self.finish_reason is None and (stopped or finish_reason is not None):
            self.finish_reason = "stop" if stopped else finish_reason
        return stopped and finish_reason is None

    def _logprobs(self, ids: list[int], logprobs: list[float], ranks: list[int]) -> dict[int, Logprob]:
        """One position's arrays -> vLLM's dict, each token decoded alone (decoded_token)."""
        decode = self.tokenizer.decode if self.tokenizer is not None else None
        return {t: Logprob(lp, r, decode([t]) if decode else None) for t, lp, r in zip(ids, logprobs, ranks)}

    def snapshot(self) -> tuple:
        return len(self.token_ids), len(self.text), self.finish_reason

    def output(self, snapshot) -> CompletionOutput:
        num_tokens, text_len, finish_reason = snapshot
        logprobs = self.logprobs[:num_tokens] if self.logprobs is not None else None
        return CompletionOutput(self.index, self.text[:text_len], self.token_ids[:num_tokens], finish_reason, logprobs)


class RequestState:
    """One live request as the frontend knows it: its n answers (one, unless SamplingParams.n > 1)."""

    def __init__(self, request_id: str, core_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, tokenizer, loop: asyncio.AbstractEventLoop):
        self.request_id, self.core_id = request_id, core_id   # the client's id; a unique one for the core
        self.prompt, self.prompt_token_ids = prompt, prompt_token_ids
        self.answers = [AnswerState(i, prompt_token_ids, params, tokenizer) for i in range(params.n)]
        self.metrics = RequestMetrics(arrival_time=time.perf_counter())
        self.loop = loop
        self.stream = RequestStream(self)

    @property
    def finished(self) -> bool:
        return all(a.finish_reason is not None for a in self.answers)

    def update(self, news: list) -> list[int]:
        """Take one step's news (EngineCoreOutputs of this request); returns the answers a stop string ended
        here (the core must abort them)."""
        stopped = [n.index for n in news
                   if self.answers[n.index].update(n.new_token_ids, n.finish_reason, n.new_logprobs)]
        now = time.perf_counter()
        if self.metrics.first_token_time is None and any(a.token_ids for a in self.answers):
            self.metrics.first_token_time = now
        if self.finished:
            self.metrics.finished_time = now
        self.stream.put(tuple(a.snapshot() for a in self.answers))
        return stopped

    def output(self, snapshot) -> RequestOutput:
        answers = [a.output(s) for a, s in zip(self.answers, snapshot)]
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, answers,
                             all(a.finish_reason is not None for a in answers), self.metrics)


class RequestStream:
    """The outputs of one request, as an async iterator; `close()` before the end aborts it."""

    def __init__(self, state: RequestState):
        self.state, self.request_id = state, state.request_id
        self._pending: collections.deque = collections.deque()   # snapshots, or the exception that ends it
        self._ready = asyncio.Event()
        self.finished = False
        self.on_close = None   # set by AsyncLLM: what closing early does (abort the request)

    def put(self, item) -> None:
        """A snapshot or an exception; called on the event loop's thread."""
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
        """The newest output each time the reader comes back: the steps it missed are merged into it
        (outputs are cumulative, so the newest holds them all)."""
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
    """The live requests by id, and what each step's message does to them."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}       # by the client's id
        self._by_core_id: dict[str, RequestState] = {}

    def add(self, state: RequestState) -> None:
        self.requests[state.request_id] = state
        self._by_core_id[state.core_id] = state

    def remove(self, state: RequestState) -> None:
        if self.requests.get(state.request_id) is state:
            del self.requests[state.request_id]
        self._by_core_id.pop(state.core_id, None)

    def process(self, message: EngineCoreOutputs, loop: asyncio.AbstractEventLoop) -> list[tuple[str, int]]:
        """Apply one step's news to the requests of `loop`; returns the (core id, answer index) pairs to abort
        (stop strings)."""
        to_abort, by_request = [], {}
        for news in message.outputs:  # (n > 1: one news per answer)
            by_request.setdefault(news.request_id, []).append(news)
        for core_id, news in by_request.items():
            state = self._by_core_id.get(core_id)
            if state is None or state.loop is not loop:  # aborted meanwhile, or another loop's
                continue
            to_abort += [(state.core_id, index) for index in state.update(news)]
            if state.finished:
                self.remove(state)
        for rejected in message.rejected:
            state = self._by_core_id.get(rejected.request_id)
            if state is not None and state.loop is loop:
                state.stream.put(ValueError(rejected.message))
                self.remove(state)
        return to_abort

    def finish(self, state: RequestState, reason: str) -> None:
        """End a request here (aborted, or the engine stopped): its reader gets a last output."""
        if not state.finished:
            for answer in state.answers:
                answer.finish_reason = answer.finish_reason or reason
            state.metrics.finished_time = time.perf_counter()
            state.stream.put(tuple(a.snapshot() for a in state.answers))
        self.remove(state)
