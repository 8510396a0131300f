"""Static batching: admit a batch, run it until its last sequence finishes, then the next.

This is the policy of a plain `generate(batch)` call. While the batch runs, nobody new
may join, even when most of its members are done and their cache rows sit idle: a
request that answers "Delhi" waits for its neighbour writing a Harry Potter essay.
Continuous batching (the next engine) lets new requests in at every step instead.
"""
from __future__ import annotations

from collections import deque

from .sequence import Sequence, SequenceStatus


class StaticScheduler:
    def __init__(self, cache, max_num_seqs: int):
        self.cache = cache
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> list[Sequence]:
        """The sequences to advance this step; each computes all its uncomputed tokens."""
        if not self.running:  # the previous batch is done: admit the next one
            while self.waiting and len(self.running) < self.max_num_seqs and self.cache.can_allocate(self.waiting[0]):
                seq = self.waiting.popleft()
                self.cache.allocate(seq)
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
        return list(self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        if seq in self.running:
            self.running.remove(seq)
            self.cache.free(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)
