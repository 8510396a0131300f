"""Speculative decoding: guess several tokens cheaply, verify them all in one forward of the model.

A decode step of a memory-bound model reads every weight to make one token; reading them to check k + 1
tokens costs about the same. So a *proposer* guesses k tokens after each sequence's last one, the model
runs on `[last, guess 1 .. guess k]` in one forward, and the rejection sampler
(`minivllm.worker.rejection_sampler`) keeps the guesses the model agrees with, plus one token of its own:
1 to k + 1 tokens per step, exactly the text (greedy) or the distribution (sampling) of the model alone.

- `ngram_proposer.py`: prompt lookup, guesses copied from earlier in the sequence (free: no model);
- `draft_model.py`: a smaller model with the same vocabulary guesses, on its own KV cache.

The scheduler reserves the guesses' slots (`Scheduler(num_lookahead_tokens=k)`); after `schedule()` the
engine asks the proposer to fill each verify entry's `draft_token_ids`.
"""
from __future__ import annotations

from ..config import SpeculativeConfig
from .draft_model import DraftModelProposer
from .ngram_proposer import NgramProposer


def make_proposer(config: SpeculativeConfig, target_runner_args: dict) -> NgramProposer | DraftModelProposer:
    """The proposer `config` names (a draft model's KV cache is allocated later, once the pool is sized)."""
    if config.method == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    return DraftModelProposer.build(config.model, target_runner_args)


__all__ = ["NgramProposer", "DraftModelProposer", "make_proposer"]
