"""The scheduler: which sequences advance this step, and by how many tokens.

Iteration-level scheduling (Orca, vLLM): the batch is rebuilt at every step.

1. Running sequences that decode get their one token first: a long prompt arriving must
   never stall the users already reading an answer.
2. Running sequences still in their prefill get the next chunk of their prompt.
3. Waiting sequences join, first come first served, while the step's token budget
   (`max_num_batched_tokens`), the KV blocks and `max_num_seqs` allow. A prompt longer
   than what is left of the budget is cut into chunks (chunked prefill, Sarathi's
   stall-free batching), so prefill and decode share one forward.

A sequence takes KV blocks for the tokens it computes now, not for its maximum length.
When the pool runs dry in the middle of the decodes, the most recently admitted sequence
is preempted: its blocks are freed and it goes back to the front of the queue, to be
recomputed later (prompt + what it generated so far), which yields exactly the same tokens.

With `continuous=False` this is static batching: nobody joins until the whole batch is done.
The batch is whoever fits the step's token budget and the KV pool when it starts, so a static
batch of N prompts needs `max_num_batched_tokens` >= their total length (the benchmark sets it).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..cache.block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    seqs: list[Sequence]
    num_new_tokens: list[int]   # tokens each sequence computes this step (1 for a decode)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = True, sliding_window: int | None = None, continuous: bool = True):
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked = enable_chunked_prefill
        self.sliding_window = sliding_window
        self.continuous = continuous
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []          # in admission order: the newest is preempted first
        self.num_preemptions = 0
        self.num_prefix_cache_hit_tokens = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # ---- the step ----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput([], [])
        budget = self.max_num_batched_tokens
        for seq in [s for s in self.running if s.num_uncomputed_tokens == 1]:   # 1. decodes
            if seq.status != SequenceStatus.RUNNING or budget == 0:
                continue  # preempted a moment ago to make room for an older sequence
            self._release_outside_window(seq)
            if self._make_room(seq):
                budget -= self._schedule(out, seq, 1)
        for seq in [s for s in self.running if s.num_uncomputed_tokens > 1]:    # 2. prefill chunks
            self._release_outside_window(seq)
            budget -= self._schedule(out, seq, self._chunk(seq, budget))
        if self.continuous or not self.running:                                  # 3. newcomers
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                n = self._admit(self.waiting[0], budget)
                if n == 0:
                    break  # first come, first served: nobody overtakes the head of the queue
                seq = self.waiting.popleft()
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                budget -= self._schedule(out, seq, n)
        return out

    def _schedule(self, out: SchedulerOutput, seq: Sequence, n: int) -> int:
        if n > 0:
            self.blocks.allocate(seq, seq.num_computed_tokens + n)
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
        return n

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """How many of the sequence's uncomputed tokens fit in the budget and the free blocks now."""
        n = seq.num_uncomputed_tokens
        room = (len(seq.block_table) + self.blocks.num_free_blocks) * self.blocks.block_size - seq.num_computed_tokens
        if not self.chunked:
            return n if n <= min(budget, room) else 0  # all of the prompt at once, or not yet
        return max(0, min(n, budget, room))

    def _admit(self, seq: Sequence, budget: int) -> int:
        """Tokens the head of the queue computes if it joins now (0 = it can't join yet)."""
        hit = self.blocks.match_prefix(seq)
        seq.num_computed_tokens = hit
        n = self._chunk(seq, budget)
        if n == 0:
            self.blocks.free(seq)
            seq.num_computed_tokens = 0
        else:
            self.num_prefix_cache_hit_tokens += hit
        return n

    def _make_room(self, seq: Sequence) -> bool:
        """Free blocks for one more token of `seq`, preempting the newest sequences if needed.
        False if `seq` itself had to go."""
        while not self.blocks.can_allocate(seq, seq.num_computed_tokens + 1):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Recompute preemption: drop the KV, keep the tokens, requeue at the front."""
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _release_outside_window(self, seq: Sequence) -> None:
        if self.sliding_window is not None:
            # The next query sits at position num_computed_tokens and sees `window` keys back.
            self.blocks.release_outside_window(seq, seq.num_computed_tokens - self.sliding_window + 1)

    # ---- after the step ----------------------------------------------------------------
    def finish(self, seq: Sequence, reason: str) -> None:
        """A sequence is done (stop, length or abort): it leaves and gives back its blocks."""
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)
