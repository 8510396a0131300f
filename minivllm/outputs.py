"""The engine core's `EngineCoreOutput` and the user-facing `RequestOutput`, as in vLLM."""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

# Per position: token ids (sampled first), logprobs, ranks.
LogprobArrays = tuple[list[int], list[float], list[int]]


class EngineCoreOutput(msgspec.Struct, array_like=True, frozen=True):
    """One request's new tokens from one step."""
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    new_logprobs: list[LogprobArrays] | None = None
    new_prompt_logprobs: list[LogprobArrays] | None = None    # prompt positions computed this step


@dataclass
class Logprob:
    """One token's log-probability."""
    logprob: float
    rank: int | None = None            # 1 = most likely
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str                  # "" without a tokenizer
    token_ids: list[int]
    finish_reason: str | None  # "length" | "stop" | "abort" | None
    logprobs: list[dict[int, Logprob]] | None = None


@dataclass
class RequestMetrics:
    arrival_time: float                     # perf_counter
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
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
