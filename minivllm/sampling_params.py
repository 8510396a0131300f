"""SamplingParams: how to pick each next token, and when to stop. vLLM's names and meanings.

    >>> SamplingParams(temperature=0, max_tokens=32)           # greedy
    >>> SamplingParams(temperature=0.8, top_p=0.95, seed=1)    # reproducible sampling
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingParams:
    temperature: float = 1.0      # 0 = greedy
    top_p: float = 1.0            # keep the smallest set of tokens whose probability reaches top_p
    top_k: int = -1               # keep the k most likely tokens; -1 = all
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    seed: int | None = None       # per-request generator: same seed, same tokens

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
