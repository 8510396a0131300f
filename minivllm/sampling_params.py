"""SamplingParams: how to pick each next token, and when to stop. vLLM's names and meanings.

    >>> SamplingParams(temperature=0, max_tokens=32)           # greedy
    >>> SamplingParams(temperature=0.8, top_p=0.95, seed=1)    # reproducible sampling
"""
from __future__ import annotations

import math
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
    stop: list[str] | str | None = None  # strings that end the answer (not included in its text)

    def __post_init__(self):
        # Values arrive from JSON bodies and CLI flags too: a wrong type gets a clear message here,
        # not a TypeError from a comparison deep in the engine.
        _check_number("temperature", self.temperature, float)
        _check_number("top_p", self.top_p, float)
        _check_number("top_k", self.top_k, int)
        _check_number("max_tokens", self.max_tokens, int)
        if self.seed is not None:
            _check_number("seed", self.seed, int)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids or []):
            raise ValueError(f"stop_token_ids must be a list of int, got {self.stop_token_ids!r}")
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


def _check_number(name: str, value, kind: type) -> None:
    """int for an int field; int or float for a float field; never bool, None or a string."""
    allowed = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, allowed) or not math.isfinite(value):
        raise ValueError(f"{name} must be {'a number' if kind is float else 'an integer'}, got {value!r}")
