"""The scheduler: which sequences advance this step, and by how many tokens (vLLM v1's two calls).

- `schedule()` plans a step: decodes first (one token each), then the running prefills' next chunks,
  then waiting requests, first come first served, while the token budget (`max_num_batched_tokens`),
  the KV blocks and `max_num_seqs` allow. A prompt longer than the budget left is chunked (chunked
  prefill), so prefills and decodes share one forward. Scheduled tokens count as computed at once.
- `update_from_output()` appends the sampled tokens, applies the stop conditions, frees finished
  sequences' blocks and returns each request's new tokens as `EngineCoreOutput`s.

When the pool runs dry, the newest running sequence is preempted: its blocks are freed and it goes
back to the front of the queue, to be recomputed later. `continuous=False` is static batching.
Speculative decoding enters through one seam, `spec_decode` (`minivllm.spec_decode.DraftSlots`): a decode
may carry slots for draft tokens (a *verify* entry) that the proposer fills after `schedule`.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..outputs import EngineCoreOutput
from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus
from .sliding_window import SlidingWindow


@dataclass
class ScheduledSequence:
    seq: Sequence
    start: int          # the first position computed this step (num_computed_tokens before it)
    num_tokens: int     # tokens computed this step: 1 for a decode, 1 + its draft tokens for a verify
    samples: bool       # the step reaches the sequence's last token: it samples the next one
    verify: bool = False
    draft_token_ids: list[int] = field(default_factory=list)  # set by the proposer after `schedule`
    # Prompt positions computed this step whose next token is a prompt token (prompt_logprobs).
    prompt_logprob_span: range = range(0)


@dataclass
class SchedulerOutput:
    decodes: list[ScheduledSequence] = field(default_factory=list)    # one token each, first in the batch
    verifies: list[ScheduledSequence] = field(default_factory=list)   # a decode and its draft tokens each
    prefills: list[ScheduledSequence] = field(default_factory=list)   # a prompt chunk each
    # Sequences that gave back their blocks since the last step (finished, aborted, preempted): the runner
    # forgets their block-table rows.
    released_request_ids: list[str] = field(default_factory=list)
    # Sequences whose block tables lost blocks at the tail (rejected draft tokens' slots), and how many
    # blocks each kept: the runner rewrites their rows from there.
    truncated_block_tables: dict[str, int] = field(default_factory=dict)

    @property
    def entries(self) -> list[ScheduledSequence]:
        return self.decodes + self.verifies + self.prefills

    @property
    def seqs(self) -> list[Sequence]:
        return [e.seq for e in self.entries]

    @property
    def num_new_tokens(self) -> list[int]:
        return [e.num_tokens for e in self.entries]

    @property
    def sampled_seqs(self) -> list[Sequence]:
        """The sequences this step samples a token for, in batch order: the rows of its output."""
        return [e.seq for e in self.entries if e.samples]

    @property
    def sampled_drafts(self) -> list[list[int]]:
        return [e.draft_token_ids for e in self.entries if e.samples]

    @property
    def num_decodes(self) -> int:
        return len(self.decodes)

    def __bool__(self) -> bool:
        return bool(self.decodes or self.verifies or self.prefills)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids=(), enable_chunked_prefill: bool = True,
                 sliding_window: int | None = None, continuous: bool = True, spec_decode=None):
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids)
        self.chunked = enable_chunked_prefill
        self.window = SlidingWindow(sliding_window, block_manager.block_size) if sliding_window else None
        self.continuous = continuous
        self.spec_decode = spec_decode  # how many draft tokens a decode may carry (None: no speculation)
        self.requests: dict[str, Sequence] = {}    # every live request, waiting or running
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []          # in admission order: the newest is preempted first
        self._released: list[str] = []
        self._truncated: dict[str, int] = {}
        self.num_preemptions = 0
        self.num_prefix_cache_hit_tokens = 0
        self.num_generation_tokens = 0  # tokens sampled and kept, whether or not anyone reads them

    def add(self, seq: Sequence) -> None:
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # ---- the step ----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        for seq in [s for s in self.running if s.num_uncomputed_tokens == 1]:   # 1. decodes
            if seq.status != SequenceStatus.RUNNING or budget == 0 or not self._may_decode(seq):
                continue  # preempted a moment ago to make room for an older sequence, or done
            self._release_outside_window(seq)
            k = self.spec_decode.num_draft_slots(seq, len(self.running), budget - 1, self.max_model_len) \
                if self.spec_decode is not None else 0
            if k and self.blocks.can_allocate(seq, seq.num_computed_tokens + 1 + k):
                budget -= self._schedule(out.verifies, seq, 1, num_draft_slots=k)
            elif self._make_room(seq):
                budget -= self._schedule(out.decodes, seq, 1)
        for seq in [s for s in self.running if s.num_uncomputed_tokens > 1]:    # 2. prefill chunks
            self._release_outside_window(seq)
            budget -= self._schedule(out.prefills, seq, self._chunk(seq, budget))
        if self.continuous or not self.running:                                  # 3. newcomers
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                if not self._may_admit(self.waiting[0]):
                    break
                n = self._admit(self.waiting[0], budget)
                if n == 0:
                    break  # first come, first served: nobody overtakes the head of the queue
                seq = self.waiting.popleft()
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                budget -= self._schedule(out.prefills, seq, n)
        if out:  # an empty step runs nothing: the runner hears of the released sequences with the next one
            out.released_request_ids, self._released = self._released, []
            out.truncated_block_tables, self._truncated = self._truncated, {}
        return out

    # Hooks for async scheduling (`AsyncScheduler`): a plain step is over before the next is planned.
    def _may_decode(self, seq: Sequence) -> bool:
        return True

    def _may_admit(self, seq: Sequence) -> bool:
        return True

    def _on_sample_scheduled(self, seq: Sequence) -> None:
        pass

    def _on_sample_returned(self, seq: Sequence) -> None:
        pass

    def _schedule(self, entries: list[ScheduledSequence], seq: Sequence, n: int, num_draft_slots: int = 0) -> int:
        """Put n tokens of `seq` in the step, with their KV slots; they count as computed from now on. A verify
        entry also gets slots for its draft tokens, which count only once accepted (`_append`)."""
        if n > 0:
            start = seq.num_computed_tokens
            self.blocks.allocate(seq, start + n + num_draft_slots)
            seq.num_computed_tokens += n
            # Name the blocks this step fills now, as vLLM does: a request admitted while the step is in
            # flight may share them, since any step that reads them runs on the GPU after this one.
            self.blocks.cache_full_blocks(seq)
            samples = seq.num_computed_tokens == seq.num_tokens
            if samples:
                self._on_sample_scheduled(seq)
            span = range(0)
            if seq.params.prompt_logprobs is not None:  # position p gives the logprobs of prompt token p + 1
                span = range(start, max(start, min(start + n, seq.num_prompt_tokens - 1)))
            entries.append(ScheduledSequence(seq, start, n + num_draft_slots, samples, verify=num_draft_slots > 0,
                                             prompt_logprob_span=span))
        return n + num_draft_slots

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """How many of the sequence's uncomputed tokens fit in the budget and the free blocks now."""
        n = seq.num_uncomputed_tokens
        room = (len(seq.block_table) + self.blocks.num_free_blocks) * self.blocks.block_size - seq.num_computed_tokens
        if not self.chunked:
            return n if n <= min(budget, room) else 0  # all of the prompt at once, or not yet
        return max(0, min(n, budget, room))

    def _admit(self, seq: Sequence, budget: int) -> int:
        """Tokens the head of the queue computes if it joins now (0 = it can't join yet)."""
        # prompt_logprobs need the logits of every prompt position: no prefix-cache hit (as vLLM)
        hit = self.blocks.match_prefix(seq) if seq.params.prompt_logprobs is None else 0
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
        self._free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _release_outside_window(self, seq: Sequence) -> None:
        if self.window is not None:
            self.window.release_behind(self.blocks, seq)

    def _free(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        self._released.append(seq.request_id)

    # ---- after the step ----------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput, sampled_token_ids: list,
                           sampled_logprobs: list | None = None, prompt_logprobs: list = ()
                           ) -> list[EngineCoreOutput]:
        """The step's tokens, one per `sampled_seqs` in order (a list for a verify: the accepted draft tokens,
        then one more), and their logprobs arrays where asked. Returns each advanced request's new tokens."""
        new_prompt_logprobs = {}
        for seq, first, arrays in prompt_logprobs:  # position p: prompt token p + 1; a recomputed chunk adds none
            have = seq.num_prompt_logprobs - first - 1
            if have >= 0 and arrays[have:]:
                new_prompt_logprobs[seq.request_id] = arrays[have:]
                seq.num_prompt_logprobs += len(arrays) - have
        sampled, logprobs, outputs = iter(sampled_token_ids), iter(sampled_logprobs or []), []
        for entry in scheduler_output.entries:
            if not entry.samples:
                if entry.seq.request_id in new_prompt_logprobs:
                    outputs.append(EngineCoreOutput(entry.seq.request_id, [],
                                                    new_prompt_logprobs=new_prompt_logprobs[entry.seq.request_id]))
                continue  # a prefill chunk before the prompt's end: nothing to sample yet
            seq, new_tokens, new_logprobs = entry.seq, next(sampled), next(logprobs, None)
            self._on_sample_returned(seq)
            if seq.is_finished:
                continue  # finished (stop, abort) while this step was in flight: its token is dropped
            tokens = self._append(seq, entry, [new_tokens] if isinstance(new_tokens, int) else new_tokens)
            outputs.append(EngineCoreOutput(
                seq.request_id, tokens, seq.finish_reason,
                None if new_logprobs is None else [new_logprobs],
                new_prompt_logprobs.get(seq.request_id)))
        return outputs

    def _append(self, seq: Sequence, entry: ScheduledSequence, new_tokens: list[int]) -> list[int]:
        """One sequence's tokens from the step, up to a stop condition; returns those appended."""
        if entry.draft_token_ids:
            accepted = len(new_tokens) - 1
            self.spec_decode.on_verified(seq, len(entry.draft_token_ids), accepted)
            seq.num_computed_tokens += accepted  # accepted draft tokens were computed from the right tokens
        appended = []
        for token in new_tokens:
            seq.token_ids.append(token)
            appended.append(token)
            self.num_generation_tokens += 1
            if seq.grammar is not None and not seq.grammar.accept_token(token):
                # The mask lets only what the grammar accepts through, unless it allowed no token at all (a
                # vocabulary that cannot spell the grammar): the output cannot go on.
                self.finish(seq, "stop")
                break
            reason = self._stop_reason(seq, token)
            if reason is not None:  # tokens after a stop are not part of the output
                self.finish(seq, reason)
                break
        if not seq.is_finished:
            self.blocks.cache_full_blocks(seq)  # a block the new tokens complete
            if entry.verify and self.blocks.free_tail(seq, len(seq)):  # rejected draft tokens' slots
                left = len(seq.block_table)
                self._truncated[seq.request_id] = min(self._truncated.get(seq.request_id, left), left)
        return appended

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if token in seq.params.stop_token_ids or (not seq.params.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if seq.grammar is not None and seq.grammar.is_terminated:  # complete (even with ignore_eos)
            return "stop"
        if seq.num_output_tokens >= seq.params.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """A sequence is done (stop, length or abort): it leaves and gives back its blocks."""
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)
        if self.requests.get(seq.request_id) is seq:
            del self.requests[seq.request_id]
