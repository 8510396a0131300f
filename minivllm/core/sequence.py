"""A Sequence: one request as the engine tracks it, from waiting to finished.

It holds the token ids (prompt then generated), how many of them have their keys and values
in the KV cache or computed by a step already launched (`num_computed_tokens`), and its KV block
table. The next step computes the tokens from `num_computed_tokens` on: the whole prompt at first,
then one token per decode step.

With the CPU and the GPU overlapped (async scheduling), the scheduler plans step n+1 before the
token sampled at step n has reached the host: that token is a *placeholder*
(`num_output_placeholders`), known to exist, its id still on the GPU. The sequence's length as the
scheduler sees it is `num_tokens`, the known tokens plus the placeholders.
"""
from __future__ import annotations

import enum
import time

import torch

from ..outputs import RequestMetrics
from ..sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 prompt: str | None = None, device: str = "cpu"):
        self.request_id = request_id
        self.prompt = prompt
        self.token_ids = list(prompt_token_ids)
        # A copy kept apart: the prompt never changes, and every step's output carries it, so it is
        # not sliced out of token_ids again and again (O(prompt) per step per sequence).
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0    # sampled on the GPU, not yet on the host
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []   # prefix hashes of its full blocks (prefix caching)
        self.num_cached_blocks = 0          # leading blocks already named in the prefix cache
        self.finish_reason: str | None = None
        self.recent_accepted: float | None = None  # speculative decoding: guesses kept per step, averaged
        self.metrics = RequestMetrics(arrival_time=time.perf_counter())
        self.detokenizer = None  # set by the engine when the model has a tokenizer: text grows per token
        self.grammar = None      # structured outputs: its RequestGrammar (set by the engine), advanced per token
        # Logprobs, if asked (SamplingParams.logprobs / prompt_logprobs): one dict per output token, and one per
        # prompt token (None for the first, which nothing predicts).
        self.logprobs: list[dict] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[dict | None] | None = [None] if params.prompt_logprobs is not None else None
        # Parallel sampling (params.n > 1): this sequence is answer 0 and prefills the prompt; the others are
        # forked from it once the prompt's last chunk is scheduled (`fork`), answer i with its `index`.
        self.index = 0
        self.parent: Sequence | None = None
        self.children: list[Sequence] = []
        self.device = device
        self.generator = None
        if params.seed is not None:  # its own random stream: the batch it lands in changes nothing
            self.generator = torch.Generator(device=device).manual_seed(params.seed)

    def fork(self, index: int) -> Sequence:
        """Answer `index` of this request: the prompt's state as it is now (tokens, computed tokens, the
        placeholder of the token this step samples; the block table is shared by the caller), its own text,
        logprobs and random stream (seed + index)."""
        child = Sequence(f"{self.request_id}/{index}", self.prompt_token_ids, self.params, self.prompt, self.device)
        child.index, child.parent, child.metrics = index, self, self.metrics
        child.status, child.num_computed_tokens = self.status, self.num_computed_tokens
        child.num_output_placeholders = self.num_output_placeholders
        child.block_hashes, child.num_cached_blocks = list(self.block_hashes), self.num_cached_blocks
        child.detokenizer = self.detokenizer.clone() if self.detokenizer is not None else None
        child.grammar = self.grammar.fork() if self.grammar is not None else None  # its own place in the grammar
        if self.params.seed is not None:
            child.generator = torch.Generator(device=self.device).manual_seed(self.params.seed + index)
        self.children.append(child)
        return child

    @property
    def group(self) -> list[Sequence]:
        """The request's answers in order of index: this sequence (answer 0) and its forks."""
        return [self, *self.children]

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
