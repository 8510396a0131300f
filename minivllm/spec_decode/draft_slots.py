"""DraftSlots: the scheduler's one seam for speculative decoding.

The scheduler asks how many draft-token slots a decode may carry this step (`num_draft_slots`) and reports
how many of them the target accepted (`on_verified`); the proposer fills the slots after `schedule`.
"""
from __future__ import annotations


class DraftSlots:
    def __init__(self, num_speculative_tokens: int, disable_by_batch_size: int | None = None,
                 adaptive: bool = False):
        self.k = num_speculative_tokens
        self.disable_by_batch_size = disable_by_batch_size
        self.adaptive = adaptive
        self.num_drafts = 0             # verify entries that carried at least one draft token
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    def num_draft_slots(self, seq, num_running: int, budget: int, max_model_len: int) -> int:
        if self.disable_by_batch_size is not None and num_running >= self.disable_by_batch_size:
            return 0
        params = seq.params
        if params.processes_logits or seq.grammar is not None or params.logprobs is not None:
            return 0  # these change with every accepted token, or need one row per sequence
        k = self.k
        if self.adaptive and seq.recent_accepted is not None:  # one more than it has been accepting
            k = min(k, 1 + int(seq.recent_accepted + 0.5))
        room = min(params.max_tokens - seq.num_output_tokens, max_model_len - len(seq)) - 1
        return max(0, min(k, room, budget))

    def on_verified(self, seq, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        # An average over the last few steps (half the weight on this one), for adaptive drafting.
        seq.recent_accepted = num_accepted if seq.recent_accepted is None else (seq.recent_accepted + num_accepted) / 2
