"""What `LLM.generate` and `LLMEngine.step` return, with vLLM's field names."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str                  # the answer so far ("" when the model has no tokenizer)
    token_ids: list[int]
    finish_reason: str | None  # "length" | "stop" | "abort" | None while running


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
