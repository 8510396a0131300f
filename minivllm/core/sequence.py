"""A Sequence: one request as the scheduler tracks it, from waiting to finished.

It holds the token ids (prompt, then output), how many of them have their keys and values in the KV
cache or in a step already launched (`num_computed_tokens`), and its KV block table. The next step
computes the tokens from `num_computed_tokens` on: the prompt (in chunks), then one token per decode.
"""
from __future__ import annotations

import enum

import torch

from ..sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, device: str = "cpu"):
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []   # prefix hashes of its full blocks (prefix caching)
        self.num_cached_blocks = 0          # leading blocks already named in the prefix cache
        self.finish_reason: str | None = None
        # Async scheduling: tokens sampled by a step in flight, not on the host yet (`AsyncScheduler`).
        self.num_output_placeholders = 0
        self.num_prompt_logprobs = 1        # prompt positions whose logprobs were sent (the first has none)
        self.recent_accepted: float | None = None  # speculative decoding: draft tokens accepted per step, averaged
        self.grammar = None                 # structured outputs: its RequestGrammar, advanced per token
        self.generator = None
        if params.seed is not None:  # its own random stream: the batch it lands in changes nothing
            self.generator = torch.Generator(device=device).manual_seed(params.seed)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        """Known tokens plus those sampled in a step still in flight."""
        return len(self.token_ids) + self.num_output_placeholders

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED
