"""SamplingParams: how to pick each next token, and when to stop. vLLM's names and meanings.

    >>> SamplingParams(temperature=0, max_tokens=32)           # greedy
    >>> SamplingParams(temperature=0.8, top_p=0.95, seed=1)    # reproducible sampling

Every field is checked when the object is made: a wrong type or an out-of-range value raises a
`ValueError` that names the field. Nothing is coerced (`stop={"a": 1}` is an error, not `["a"]`),
and every int fits in signed 64 bits, so a request can be sent between processes with msgpack.
"""
from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass

from .structured_outputs_params import StructuredOutputsParams

INT32_MAX = 2**31 - 1                      # bound of the counts (top_k, max_tokens): ample
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1   # what msgpack's int64 and torch's manual_seed both take
MAX_N = 256                                # answers per request: a bound, the engine's max_num_seqs is the real one
MAX_LOGPROBS = 20                          # vLLM's default max_logprobs: the most top tokens a request may ask


@dataclass
class SamplingParams:
    temperature: float = 1.0      # 0 = greedy
    top_p: float = 1.0            # keep the smallest set of tokens whose probability reaches top_p
    top_k: int = -1               # keep the k most likely tokens; -1 = all
    max_tokens: int = 16          # a value past the context simply means "until the context is full"
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    seed: int | None = None       # per-request generator: same seed, same tokens
    stop: list[str] | str | None = None  # strings that end the answer (not included in its text)
    # Logits processing (vLLM's and OpenAI's meanings), applied on the device before sampling, greedy too:
    presence_penalty: float = 0.0     # minus this from every token already in the answer
    frequency_penalty: float = 0.0    # minus this times how often the token is in the answer
    repetition_penalty: float = 1.0   # tokens in the prompt or the answer: logit / r if > 0, else logit * r
    min_p: float = 0.0                # drop tokens less likely than min_p times the most likely one
    min_tokens: int = 0               # no end of sequence (EOS, stop_token_ids) before this many tokens
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    structured_outputs: StructuredOutputsParams | None = None  # a schema, regex, choice or grammar to follow
    # Logprobs (vLLM's meaning): None = off; N = each sampled token's logprob and rank plus the N most likely
    # tokens' (0..MAX_LOGPROBS). From the raw model logits, before any processing, temperature or top-k/top-p
    # (vLLM's default logprobs_mode, "raw_logprobs"). prompt_logprobs: the same for every prompt position.
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # Parallel sampling: n answers to one prompt, prefilled once, its KV blocks shared (copied on write).
    # Answer i draws with seed + i (a seed given): each equals the one that seed gives alone.
    n: int = 1

    def __post_init__(self):
        # Values arrive from JSON bodies and CLI flags too: a wrong one gets a clear message here,
        # not a TypeError from a comparison, or an overflow in torch, deep in the engine.
        _check_real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        _check_real("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, -1, INT32_MAX)
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (off) or >= 1, got 0")
        _check_int("max_tokens", self.max_tokens, 1, INT32_MAX)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {_show(self.ignore_eos)}")
        if self.seed is not None:
            _check_int("seed", self.seed, INT64_MIN, INT64_MAX)
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if not _list_of(stop, lambda s: isinstance(s, str) and s != ""):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {_show(self.stop)}")
        if not _list_of(self.stop_token_ids, lambda t: _is_int(t) and 0 <= t <= INT64_MAX):
            raise ValueError(f"stop_token_ids must be a list of token ids (integers >= 0), "
                             f"got {_show(self.stop_token_ids)}")
        self.stop, self.stop_token_ids = list(stop or []), list(self.stop_token_ids or [])  # copies
        for name in ("presence_penalty", "frequency_penalty"):
            _check_real(name, getattr(self, name))
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        _check_real("repetition_penalty", self.repetition_penalty)
        if not 0 < self.repetition_penalty <= 100:
            raise ValueError(f"repetition_penalty must be in (0, 100], got {self.repetition_penalty}")
        _check_real("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        _check_int("min_tokens", self.min_tokens, 0, self.max_tokens)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(
                    _is_int(t) and 0 <= t <= INT64_MAX and (_is_int(b) or isinstance(b, float))
                    and -100 <= b <= 100 for t, b in self.logit_bias.items()):  # (NaN fails the range)
                raise ValueError(f"logit_bias must map token ids (integers >= 0) to numbers in [-100, 100], "
                                 f"got {_show(self.logit_bias)}")
            self.logit_bias = {t: float(b) for t, b in self.logit_bias.items()} or None  # {} asks for nothing
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, "
                             f"got {_show(self.structured_outputs)}")
        _check_int("n", self.n, 1, MAX_N)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 0, MAX_LOGPROBS)

    @property
    def processes_logits(self) -> bool:
        """Whether any penalty, bias, min_p or min_tokens changes the logits before sampling."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1 or self.min_p
                    or self.min_tokens or self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _show(value) -> str:
    return reprlib.repr(value)  # a bounded repr: a 10 MB string in a request makes a short message


def _list_of(value, ok) -> bool:
    """None, or a list or tuple whose every item is ok (a dict or a set is not taken for its keys)."""
    return value is None or (isinstance(value, (list, tuple)) and all(ok(v) for v in value))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is no token id


def _check_int(name: str, value, low: int, high: int) -> None:
    if not _is_int(value):
        raise ValueError(f"{name} must be an integer, got {_show(value)}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {_show(value)}")


def _check_real(name: str, value) -> None:
    """A float field takes an int or a float, finite; never bool, None or a string."""
    if _is_int(value):
        _check_int(name, value, INT64_MIN, INT64_MAX)  # before isfinite, which overflows on 10**400
    elif not isinstance(value, float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {_show(value)}")
