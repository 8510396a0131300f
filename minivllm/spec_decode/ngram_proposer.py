"""The n-gram proposer (prompt lookup decoding): a search on the CPU.

Proposes the tokens that followed the latest earlier occurrence of the sequence's last n tokens,
trying n from `prompt_lookup_max` down to `prompt_lookup_min`.

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
        """Up to k draft tokens after `token_ids`."""
        length = len(token_ids)
        if k < 1 or length < self.min_n + 1:
            return []
        # Every n-gram match ends at an earlier position of the last token.
        ends = np.flatnonzero(np.asarray(token_ids[:-1]) == token_ids[-1])[::-1]
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = token_ids[length - n:]
            for end in ends.tolist():
                if end >= n - 1 and token_ids[end - n + 1:end + 1] == suffix:
                    return token_ids[end + 1:end + 1 + k]
        return []

    def propose(self, scheduler_output: SchedulerOutput) -> torch.Tensor | None:
        """Fill every verify entry's draft tokens; None: the draft tokens' q is one-hot."""
        for entry in scheduler_output.verifies:
            entry.draft_token_ids = self.propose_for(entry.seq.token_ids, entry.num_tokens - 1)
            entry.num_tokens = 1 + len(entry.draft_token_ids)
        return None
