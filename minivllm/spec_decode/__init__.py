"""Speculative decoding: propose k draft tokens cheaply, then verify them in one forward of the target model.

Decoding is memory-bound, so checking k + 1 tokens costs about as much as generating one. The rejection
sampler keeps the output distribution of the target model alone.
"""
from __future__ import annotations

from ..config import SpeculativeConfig
from .draft_model import DraftModelProposer
from .draft_slots import DraftSlots
from .ngram_proposer import NgramProposer


def make_proposer(config: SpeculativeConfig, target_runner_args: dict) -> NgramProposer | DraftModelProposer:
    """The proposer `config` names."""
    if config.method == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    return DraftModelProposer.build(config.model, target_runner_args)


__all__ = ["DraftModelProposer", "DraftSlots", "NgramProposer", "make_proposer"]
