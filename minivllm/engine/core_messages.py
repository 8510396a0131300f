"""What the frontend and the engine core say to each other: typed msgspec structs, sent as msgpack.

The core runs in a process of its own (see `core.py`), so every request, abort and step result
crosses a socket. msgpack with typed structs (msgspec) keeps that cheap and safe: encoding a step's
message is a few microseconds, and decoding checks every field's type against the struct, so a
malformed message is refused as a whole. Nothing is pickled: unpickling runs arbitrary code.

Frontend -> core: `EngineCoreRequest` (token ids and sampling values: text was tokenized in the
frontend), `AbortRequests`, `Shutdown`.
Core -> frontend: `EngineCoreReady` (once, with the sizes the frontend checks requests against),
`EngineCoreOutputs` (one per step: every request's new token ids, finish reasons, the stats
`/metrics` reads, requests the core refused), `EngineCoreFailed` (the core is about to exit).
"""
from __future__ import annotations

import msgspec

from ..sampling_params import SamplingParams, StructuredOutputsParams


class EngineCoreRequest(msgspec.Struct, tag="add", frozen=True):
    """A request as the core runs it: token ids and the sampling values that act on tokens (stop
    strings stay in the frontend, which owns the text)."""
    request_id: str
    prompt_token_ids: list[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    ignore_eos: bool
    stop_token_ids: list[int]
    seed: int | None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    # Structured outputs as (kind, text): "json" and a schema's JSON text, "regex", "choice" and a JSON list, ...
    # The core compiles the grammar (it holds the matchers); the frontend checked the spec already.
    structured_outputs: tuple[str, str] | None = None
    logprobs: int | None = None
    n: int = 1

    @classmethod
    def of(cls, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> EngineCoreRequest:
        return cls(request_id, prompt_token_ids, float(params.temperature), float(params.top_p), params.top_k,
                   params.max_tokens, params.ignore_eos, params.stop_token_ids, params.seed,
                   float(params.presence_penalty), float(params.frequency_penalty), float(params.repetition_penalty),
                   float(params.min_p), params.min_tokens, params.logit_bias,
                   params.structured_outputs.key if params.structured_outputs is not None else None,
                   params.logprobs, params.n)

    def sampling_params(self) -> SamplingParams:
        """Checked again (SamplingParams raises ValueError): what arrives on a socket is not trusted."""
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=self.max_tokens, ignore_eos=self.ignore_eos,
                              stop_token_ids=self.stop_token_ids, seed=self.seed,
                              presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                              repetition_penalty=self.repetition_penalty, min_p=self.min_p,
                              min_tokens=self.min_tokens, logit_bias=self.logit_bias,
                              structured_outputs=StructuredOutputsParams.from_key(*self.structured_outputs)
                              if self.structured_outputs is not None else None, logprobs=self.logprobs, n=self.n)


class AbortRequests(msgspec.Struct, tag="abort", frozen=True):
    request_ids: list[str]
    answers: list[tuple[str, int]] = []   # (request id, index): one answer of an n > 1 request (a stop string)


class Shutdown(msgspec.Struct, tag="shutdown", frozen=True):
    pass


class EngineCoreOutput(msgspec.Struct, array_like=True, frozen=True):
    """One answer's news from one step (n > 1: one per answer). array_like: sent as a list, without names."""
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None   # set on the request's last output
    # With SamplingParams.logprobs: per new token, arrays (token ids, logprobs, ranks), the chosen token first
    new_logprobs: list[tuple[list[int], list[float], list[int]]] | None = None
    index: int = 0                     # which answer (SamplingParams.n > 1)


class RejectedRequest(msgspec.Struct, array_like=True, frozen=True):
    request_id: str
    message: str


class EngineCoreOutputs(msgspec.Struct, tag="outputs", frozen=True):
    outputs: list[EngineCoreOutput]
    stats: dict[str, int]                       # LLMEngine.get_stats() after the step
    rejected: list[RejectedRequest] = []


class EngineCoreReady(msgspec.Struct, tag="ready", frozen=True):
    """The sizes a request is checked against, known only once the core has sized its KV pool."""
    vocab_size: int
    max_model_len: int
    block_size: int
    num_total_blocks: int
    max_num_batched_tokens: int
    sliding_window: int | None
    stats: dict[str, int]
    max_num_seqs: int = 1 << 30   # the most answers (SamplingParams.n) a request may ask


class EngineCoreFailed(msgspec.Struct, tag="failed", frozen=True):
    error_type: str       # "ValueError" for a bad configuration found at startup
    message: str


CoreInput = EngineCoreRequest | AbortRequests | Shutdown
CoreOutput = EngineCoreOutputs | EngineCoreReady | EngineCoreFailed
