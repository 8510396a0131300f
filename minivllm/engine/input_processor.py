"""The input processor: a prompt becomes validated token ids, or a clear ValueError, before anything is queued.

An empty prompt, ids outside the vocabulary, a prompt that does not fit `max_model_len`, a request that
could never fit in the KV pool or a schema that makes no grammar fails that request alone. The frontend
checks here and answers 400 at once; the engine core checks again (`check`): a socket is not trusted.
"""
from __future__ import annotations

from ..core.block_manager import cdiv
from ..core.sliding_window import SlidingWindow
from ..sampling_params import SamplingParams
from ..structured_output import check_structured_outputs


class InputProcessor:
    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, block_size: int, num_total_blocks: int,
                 max_num_batched_tokens: int, sliding_window: int | None):
        self.tokenizer = tokenizer
        self.vocab_size, self.max_model_len = vocab_size, max_model_len
        self.block_size, self.num_total_blocks = block_size, num_total_blocks
        self.max_num_batched_tokens, self.sliding_window = max_num_batched_tokens, sliding_window

    def encode_prompt(self, prompt) -> tuple[str | None, list[int]]:
        """A str, a list of token ids, or {"prompt_token_ids": [...]} -> (text, token ids), validated."""
        text = None
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise ValueError("a dict prompt needs the key 'prompt_token_ids'")
            prompt = prompt["prompt_token_ids"]
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass token ids, not text")
            text, prompt = prompt, self.tokenizer.encode(prompt)
        if not isinstance(prompt, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise ValueError(f"a prompt is a str, a list of int token ids or a dict; got {type(prompt).__name__}")
        if not prompt:
            raise ValueError("empty prompt: at least one token is needed")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room to generate within "
                             f"max_model_len={self.max_model_len}")
        return text, list(prompt)

    def blocks_needed_at_most(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        tokens = min(num_prompt_tokens + params.max_tokens, self.max_model_len)
        if self.sliding_window is not None:
            return SlidingWindow(self.sliding_window, self.block_size).max_blocks(tokens, self.max_num_batched_tokens)
        return cdiv(tokens, self.block_size)

    def process(self, prompt, params: SamplingParams | None) -> tuple[str | None, list[int], SamplingParams]:
        """(text, token ids, sampling params) of a request that can run; ValueError otherwise."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        text, token_ids = self.encode_prompt(prompt)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none (use stop_token_ids)")
        self.check(token_ids, params)
        return text, token_ids, params

    def check(self, token_ids: list[int], params: SamplingParams) -> None:
        """What the engine core checks again, on token ids: a request it could never run is a ValueError."""
        self.encode_prompt(token_ids)
        need = self.blocks_needed_at_most(len(token_ids), params)
        if need > self.num_total_blocks:
            raise ValueError(f"request needs up to {need} KV blocks but the pool has "
                             f"{self.num_total_blocks}: it could never run")
        outside = [t for t in (params.logit_bias or {}) if t >= self.vocab_size]
        if outside:
            raise ValueError(f"logit_bias names token ids outside the vocabulary (0..{self.vocab_size - 1}): "
                             f"{outside[:5]}")
        if params.structured_outputs is not None:  # a bad schema, regex or grammar is refused here
            check_structured_outputs(params.structured_outputs)
