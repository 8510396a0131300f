"""The n-gram proposer (prompt lookup decoding): what followed the last few tokens the last time they occurred.

Answers often copy their input: a rewritten paragraph, edited code, a quote from a given document. Then the
sequence's last n tokens have occurred before, and what followed them then is a good guess for what follows
now. For n from `prompt_lookup_max` down to `prompt_lookup_min`, the latest earlier occurrence of the last
n tokens proposes the (up to) k tokens after it; no occurrence, no guess (the step is a plain decode, so a
failed lookup costs only the search). No model, no GPU: a few list comparisons on the CPU.

    >>> NgramProposer(1, 3).propose_for([5, 6, 7, 8, 5, 6], k=2)
    [7, 8]
"""
from __future__ import annotations

import numpy as np
import torch

from ..core.scheduler import SchedulerOutput


class NgramProposer:
    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max

    def propose_for(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k guesses after `token_ids`."""
        length = len(token_ids)
        if k < 1 or length < self.min_n + 1:
            return []
        # Where the last token occurred before (numpy, so the scan runs in C, not token by token in Python);
        # an n-gram match must end at one of these places.
        ends = np.flatnonzero(np.asarray(token_ids[:-1]) == token_ids[-1])[::-1]   # latest first
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = token_ids[length - n:]
            for end in ends.tolist():
                if end >= n - 1 and token_ids[end - n + 1:end + 1] == suffix:
                    return token_ids[end + 1:end + 1 + k]
        return []

    def propose(self, scheduler_output: SchedulerOutput) -> torch.Tensor | None:
        """Fill every verify entry's guesses (its tokens to compute shrink to match). Sure guesses: no
        distribution to return (the rejection sampler takes them as one-hot)."""
        for entry in scheduler_output.verifies:
            entry.draft_token_ids = self.propose_for(entry.seq.token_ids, entry.num_tokens - 1)
            entry.num_tokens = 1 + len(entry.draft_token_ids)
        return None
