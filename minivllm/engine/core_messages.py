"""What the frontend and the engine core say to each other: typed msgspec structs, sent as msgpack.

Decoding checks every field's type (and `SamplingParams` checks its values), so a malformed message is
refused as a whole; nothing is pickled. Frontend -> core: `EngineCoreRequest`, `AbortRequests`,
`Shutdown`. Core -> frontend: `EngineCoreReady` (once, with the sizes requests are checked against),
`EngineCoreOutputs` (one per step), `EngineCoreFailed` (the core is about to exit).
"""
from __future__ import annotations

import msgspec

from ..outputs import EngineCoreOutput
from ..sampling_params import SamplingParams


class EngineCoreRequest(msgspec.Struct, tag="add", frozen=True):
    """A request as the core runs it: token ids (the frontend tokenized the text) and its sampling
    parameters (stop strings included, though only the frontend, which owns the text, matches them)."""
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams


class AbortRequests(msgspec.Struct, tag="abort", frozen=True):
    request_ids: list[str]


class Shutdown(msgspec.Struct, tag="shutdown", frozen=True):
    pass


class RejectedRequest(msgspec.Struct, array_like=True, frozen=True):
    request_id: str
    message: str


class EngineCoreOutputs(msgspec.Struct, tag="outputs", frozen=True):
    outputs: list[EngineCoreOutput]
    stats: dict[str, int]                       # EngineCore.get_stats() after the step
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
    max_num_seqs: int


class EngineCoreFailed(msgspec.Struct, tag="failed", frozen=True):
    error_type: str       # "ValueError" for a bad configuration found at startup
    message: str


CoreInput = EngineCoreRequest | AbortRequests | Shutdown
CoreOutput = EngineCoreOutputs | EngineCoreReady | EngineCoreFailed
