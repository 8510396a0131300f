"""SamplingParams: how to pick each next token and when to stop, with vLLM's names and meanings.

Fields are validated on construction (a `ValueError` naming the field, no coercion); ints fit in
int64 so requests can cross processes as msgpack.
"""
from __future__ import annotations

import enum
import math
import reprlib
from dataclasses import dataclass

from .structured_outputs_params import StructuredOutputsParams

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1   # msgpack's int64 and torch's manual_seed
MAX_N = 256                                # the engine's max_num_seqs is the real bound
MAX_LOGPROBS = 20                          # vLLM's default max_logprobs


class RequestOutputKind(enum.IntEnum):
    """What each output of a request holds (vLLM's names)."""
    CUMULATIVE = 0   # everything so far
    DELTA = 1        # only what is new since the request's last output
    FINAL_ONLY = 2   # one output, when the request finishes


@dataclass
class SamplingParams:
    temperature: float = 1.0      # 0 = greedy
    top_p: float = 1.0            # smallest set of tokens whose probability reaches top_p
    top_k: int = -1               # k most likely tokens; -1 = all
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stop: list[str] | str | None = None  # excluded from the output text
    # Logits processing, applied before sampling (greedy too):
    presence_penalty: float = 0.0     # minus this for every token already in the output
    frequency_penalty: float = 0.0    # minus this times the token's count in the output
    repetition_penalty: float = 1.0   # over prompt and output: logit / r if > 0, else logit * r
    min_p: float = 0.0                # drop tokens below min_p times the top probability
    min_tokens: int = 0               # no EOS or stop_token_ids before this many tokens
    logit_bias: dict[int, float] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # N top tokens per position, plus the sampled one, from the raw logits (vLLM's "raw_logprobs").
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    n: int = 1                    # with a seed, completion i samples with seed + i
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self):
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
        self.stop, self.stop_token_ids = list(stop or []), list(self.stop_token_ids or [])
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
                    and -100 <= b <= 100 for t, b in self.logit_bias.items()):  # rejects NaN
                raise ValueError(f"logit_bias must map token ids (integers >= 0) to numbers in [-100, 100], "
                                 f"got {_show(self.logit_bias)}")
            self.logit_bias = {t: float(b) for t, b in self.logit_bias.items()} or None
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, "
                             f"got {_show(self.structured_outputs)}")
        _check_int("n", self.n, 1, MAX_N)
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {_show(self.output_kind)}")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 0, MAX_LOGPROBS)

    @property
    def processes_logits(self) -> bool:
        """Whether any penalty, bias, min_p or min_tokens changes the logits."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1 or self.min_p
                    or self.min_tokens or self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _show(value) -> str:
    return reprlib.repr(value)  # bounded length


def _list_of(value, ok) -> bool:
    """None, or a list or tuple whose every item is ok."""
    return value is None or (isinstance(value, (list, tuple)) and all(ok(v) for v in value))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value, low: int, high: int) -> None:
    if not _is_int(value):
        raise ValueError(f"{name} must be an integer, got {_show(value)}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {_show(value)}")


def _check_real(name: str, value) -> None:
    """A finite int or float; not bool."""
    if _is_int(value):
        _check_int(name, value, INT64_MIN, INT64_MAX)  # isfinite overflows on 10**400
    elif not isinstance(value, float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {_show(value)}")
