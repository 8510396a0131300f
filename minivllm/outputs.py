"""What the engine core returns per step (`EngineCoreOutput`) and what `LLM.generate` and `LLMEngine.step`
return (`RequestOutput`), with vLLM's field names."""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

# One position's logprobs as arrays: token ids (the chosen one first), their logprobs, their ranks.
LogprobArrays = tuple[list[int], list[float], list[int]]


class EngineCoreOutput(msgspec.Struct, array_like=True, frozen=True):
    """One request's new tokens from one step (sent as a list, without field names)."""
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None                          # set on the request's last output
    new_logprobs: list[LogprobArrays] | None = None           # one per new token, if asked
    new_prompt_logprobs: list[LogprobArrays] | None = None    # prompt positions computed this step, if asked


@dataclass
class Logprob:
    """One token's log-probability at one position (vLLM's Logprob)."""
    logprob: float
    rank: int | None = None            # 1 = the most likely token there
    decoded_token: str | None = None   # the token alone, decoded (None without a tokenizer)


@dataclass
class CompletionOutput:
    index: int
    text: str                  # the output so far ("" when the model has no tokenizer)
    token_ids: list[int]
    finish_reason: str | None  # "length" | "stop" | "abort" | None while running
    # SamplingParams.logprobs set: one dict per token of token_ids, token id -> Logprob (the chosen one first)
    logprobs: list[dict[int, Logprob]] | None = None


@dataclass
class RequestMetrics:
    arrival_time: float                     # time.perf_counter() clock, seconds
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics = field(default=None)
    # SamplingParams.prompt_logprobs set: one per prompt token, None for the first (nothing comes before it)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
