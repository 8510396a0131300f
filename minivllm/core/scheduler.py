"""The scheduler: which sequences advance this step, and by how many tokens; and the books after it.

It owns the state of every live request: the queue, the running batch, each sequence's tokens and
its KV blocks (through the block manager). Two methods make a step, as in vLLM's v1 engine:

- `schedule()` plans step n: a `SchedulerOutput` that lists the decodes (one token each) and the
  prefill chunks explicitly, and marks the tokens it schedules as computed at once;
- `update_from_output(scheduler_output, sampled_token_ids)` takes the tokens the step sampled:
  it appends them, applies the stop conditions and finishes sequences. (Blocks that become full
  are named for the prefix cache as soon as they are scheduled, or, for a block that a sampled
  token completes, when that token arrives.)

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

Overlap (async scheduling): step n+1 may be scheduled before step n's tokens are known. A
sequence whose step n samples a token counts it as a placeholder (`num_output_placeholders`), so
step n+1 schedules its decode at the right position (the model runner takes the token id from the
GPU). A sequence that finishes at step n while step n+1 already holds it wastes that one slot: when
step n+1's output comes, its token is dropped. One that surely ends with its placeholder
(`max_tokens`, `max_model_len`) is not scheduled again.

Speculative decoding (`num_lookahead_tokens` = k): a decode may also carry up to k guessed tokens
after its last one, to be verified in the same forward (a *verify* entry). The scheduler counts them in
the step's budget and gives them KV slots, but counts only the real token as computed: after the step,
`update_from_output` adds the guesses the model kept (their keys and values are right), appends the
emitted tokens, and gives back the blocks past the sequence's end. So a block holding a guess that
was not verified is never named for the prefix cache. No guesses past a request's `max_tokens` or
`max_model_len`, none for a request under a grammar (structured outputs) or with penalties, none while
`spec_disable_by_batch_size` sequences or more run, and none that would
need a preemption: the decode then goes without them. With `spec_adaptive`, a sequence reserves one
guess more than it has recently been keeping (`Sequence.recent_accepted`).

Parallel sampling (`SamplingParams.n` > 1): the request is one sequence (answer 0) while its prompt is
prefilled; when the prompt's last chunk is scheduled, n - 1 more sequences are forked from it (`fork`),
sharing its KV blocks, and the step samples n tokens from the last position's logits (`forks`). From then
on each answer is a sequence of its own: a block it writes while others hold it is copied first (the
block manager's copy-on-write, the copies listed in `block_copies`), a preempted answer recomputes alone
(prompt + its tokens, the prompt's blocks maybe from the prefix cache). A request joins only if its n
answers fit in `max_num_seqs`.

With `continuous=False` this is static batching: nobody joins until the whole batch is done.
The batch is whoever fits the step's token budget and the KV pool when it starts, so a static
batch of N prompts needs `max_num_batched_tokens` >= their total length (the benchmark sets it).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSequence:
    seq: Sequence
    start: int          # the first position computed this step (num_computed_tokens before it)
    num_tokens: int     # tokens computed this step: 1 for a decode, 1 + its guesses for a verify
    samples: bool       # the step reaches the sequence's last token: it samples the next one
    # A verify entry (a decode with room for guesses) and its guesses, set by the proposer after `schedule`.
    verify: bool = False
    draft_token_ids: list[int] = field(default_factory=list)
    # Prompt positions computed this step whose next token is a prompt token, for prompt_logprobs (if asked).
    prompt_logprob_span: range = range(0)
    # n > 1: the answers forked at this step (the prompt's last chunk); they sample from its last row too.
    forks: list[Sequence] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    decodes: list[ScheduledSequence] = field(default_factory=list)    # one token each, first in the batch
    verifies: list[ScheduledSequence] = field(default_factory=list)   # a decode and its guesses each
    prefills: list[ScheduledSequence] = field(default_factory=list)   # a prompt chunk each
    # Sequences that gave back their KV blocks since the last step that ran (finished, aborted,
    # preempted): the model runner forgets their block-table rows.
    released_request_ids: list[str] = field(default_factory=list)
    # Sequences whose block lists lost blocks at the tail since the last step that ran (the slots of guesses
    # not kept), or had one replaced (copy-on-write), and how many blocks each kept unchanged: the runner
    # rewrites their block-table rows from there.
    truncated_block_tables: dict[str, int] = field(default_factory=dict)
    # Copy-on-write: (source, destination) KV blocks to copy before the step's forward.
    block_copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def entries(self) -> list[ScheduledSequence]:
        return self.decodes + self.verifies + self.prefills

    @property
    def seqs(self) -> list[Sequence]:
        return [s for e in self.entries for s in (e.seq, *e.forks)]

    @property
    def num_new_tokens(self) -> list[int]:
        return [e.num_tokens for e in self.entries]

    @property
    def sampled_seqs(self) -> list[Sequence]:
        """The sequences this step samples a token for, in batch order: the rows of its output."""
        return [s for e in self.entries if e.samples for s in (e.seq, *e.forks)]

    @property
    def sampled_drafts(self) -> list[list[int]]:
        """The guesses of each sampled sequence (forks have none)."""
        return [e.draft_token_ids for e in self.entries if e.samples for _ in range(1 + len(e.forks))]

    @property
    def num_decodes(self) -> int:
        return len(self.decodes)

    def __bool__(self) -> bool:
        return bool(self.decodes or self.verifies or self.prefills)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids=(), enable_chunked_prefill: bool = True,
                 sliding_window: int | None = None, continuous: bool = True, num_lookahead_tokens: int = 0,
                 spec_disable_by_batch_size: int | None = None, spec_adaptive: bool = False):
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids)
        self.chunked = enable_chunked_prefill
        self.sliding_window = sliding_window
        self.continuous = continuous
        self.num_lookahead_tokens = num_lookahead_tokens
        self.spec_disable_by_batch_size = spec_disable_by_batch_size
        self.spec_adaptive = spec_adaptive
        self.requests: dict[str, Sequence] = {}    # every live request, waiting or running
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []          # in admission order: the newest is preempted first
        self._released: list[str] = []
        self._truncated: dict[str, int] = {}
        self.num_preemptions = 0
        self.num_prefix_cache_hit_tokens = 0
        self.num_drafts = 0             # verify entries that carried at least one guess
        self.num_draft_tokens = 0       # guesses verified
        self.num_accepted_tokens = 0    # guesses kept

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
            # A sequence whose token in flight is its last stays in `running` until that token arrives
            # (it may even be preempted meanwhile, harmlessly: it finishes at the next update all the same).
            if seq.status != SequenceStatus.RUNNING or budget == 0 or self._ends_with_placeholder(seq):
                continue  # preempted a moment ago to make room for an older sequence, or done
            self._release_outside_window(seq)
            lookahead = self._lookahead(seq, budget - 1)
            if lookahead and self.blocks.can_allocate(seq, seq.num_computed_tokens + 1 + lookahead):
                budget -= self._schedule_verify(out.verifies, seq, lookahead)
            elif self._make_room(seq):
                budget -= self._schedule(out.decodes, seq, 1)
        for seq in [s for s in self.running if s.num_uncomputed_tokens > 1]:    # 2. prefill chunks
            self._release_outside_window(seq)
            budget -= self._schedule(out.prefills, seq, self._chunk(seq, budget))
        if self.continuous or not self.running:                                  # 3. newcomers
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                if self.waiting[0].num_output_placeholders:
                    break  # preempted while its last token was in flight: that id must reach the host first
                if self._num_seqs_after_forks() + self._seqs_to_fork(self.waiting[0]) >= self.max_num_seqs:
                    break  # its answers would not all fit
                n = self._admit(self.waiting[0], budget)
                if n == 0:
                    break  # first come, first served: nobody overtakes the head of the queue
                seq = self.waiting.popleft()
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                budget -= self._schedule(out.prefills, seq, n)
        if out:  # an empty step runs nothing: the runner hears of the released sequences with the next one
            for request_id, i, src, dst in self.blocks.pending_copies:  # a table entry replaced: rewrite from it
                self._truncated[request_id] = min(self._truncated.get(request_id, i), i)
                out.block_copies.append((src, dst))
            self.blocks.pending_copies = []
            out.released_request_ids, self._released = self._released, []
            out.truncated_block_tables, self._truncated = self._truncated, {}
        return out

    @staticmethod
    def _seqs_to_fork(seq: Sequence) -> int:
        """Answers still to be forked from `seq` (n > 1, before the end of its prompt)."""
        return seq.params.n - 1 if seq.parent is None and not seq.children and not seq.num_output_tokens else 0

    def _num_seqs_after_forks(self) -> int:
        n = len(self.running)
        for seq in self.running:
            if seq.params.n > 1:
                n += self._seqs_to_fork(seq)
        return n

    def _fork(self, seq: Sequence) -> list[Sequence]:
        """The other n - 1 answers of `seq`'s request, sharing its blocks, running from this step on."""
        children = [seq.fork(i) for i in range(1, seq.params.n)]
        for child in children:
            self.blocks.fork(seq, child)
            self.running.append(child)
            self.requests[child.request_id] = child
        return children

    def _schedule(self, entries: list[ScheduledSequence], seq: Sequence, n: int) -> int:
        """Put n tokens of `seq` in the step, with their KV slots; they count as computed from now on."""
        if n > 0:
            start = seq.num_computed_tokens
            self.blocks.allocate(seq, start + n)
            seq.num_computed_tokens += n
            # Name the blocks this step fills now, not when it is done (as vLLM does): a request admitted
            # while the step is still in flight can share them, since any step that reads them runs on the
            # GPU after this one has written them.
            self.blocks.cache_full_blocks(seq)
            samples = seq.num_computed_tokens == seq.num_tokens
            if samples:
                seq.num_output_placeholders += 1
            span = range(0)
            if seq.params.prompt_logprobs is not None:  # position p gives the logprobs of prompt token p + 1
                span = range(start, max(start, min(start + n, seq.num_prompt_tokens - 1)))
            forks = self._fork(seq) if samples and seq.params.n > 1 and self._seqs_to_fork(seq) else []
            entries.append(ScheduledSequence(seq, start, n, samples, prompt_logprob_span=span, forks=forks))
        return n

    def _lookahead(self, seq: Sequence, budget: int) -> int:
        """How many guesses `seq` may carry this step (0: a plain decode)."""
        if not self.num_lookahead_tokens or (self.spec_disable_by_batch_size is not None
                                             and len(self.running) >= self.spec_disable_by_batch_size):
            return 0
        if seq.params.processes_logits or seq.grammar is not None:
            return 0  # penalties and grammars change with every token kept: no guesses to verify at once
        if seq.params.logprobs is not None:  # logprobs are computed for one sampled row per sequence: none
            return 0
        k = self.num_lookahead_tokens
        if self.spec_adaptive and seq.recent_accepted is not None:  # one more than it has been keeping
            k = min(k, 1 + int(seq.recent_accepted + 0.5))
        # Up to k + 1 tokens come out: never past max_tokens or max_model_len.
        room = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - len(seq)) - 1
        return max(0, min(k, room, budget))

    def _schedule_verify(self, entries: list[ScheduledSequence], seq: Sequence, lookahead: int) -> int:
        """The sequence's last token and room for `lookahead` guesses; only the real token counts as
        computed (the guesses' slots are given back after the step if the model does not keep them)."""
        start = seq.num_computed_tokens
        self.blocks.allocate(seq, start + 1 + lookahead)
        seq.num_computed_tokens += 1
        self.blocks.cache_full_blocks(seq)
        seq.num_output_placeholders += 1
        entries.append(ScheduledSequence(seq, start, 1 + lookahead, True, verify=True))
        return 1 + lookahead

    def _ends_with_placeholder(self, seq: Sequence) -> bool:
        """The token still in flight is surely this sequence's last (length limits): no more steps."""
        return seq.num_output_placeholders > 0 and (
            seq.num_output_tokens + seq.num_output_placeholders >= seq.params.max_tokens
            or seq.num_tokens >= self.max_model_len)

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
        """Recompute preemption: drop the KV, keep the tokens, requeue at the front. (A step in
        flight may still write the freed blocks: it runs on the GPU before any later step that
        reuses them.)"""
        self.running.remove(seq)
        self._free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _release_outside_window(self, seq: Sequence) -> None:
        if self.sliding_window is not None:
            # The next query sits at position num_computed_tokens and sees `window` keys back.
            self.blocks.release_outside_window(seq, seq.num_computed_tokens - self.sliding_window + 1)

    def _free(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        self._released.append(seq.request_id)

    # ---- after the step ----------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput, sampled_token_ids: list,
                           sampled_logprobs: list | None = None) -> list[Sequence]:
        """The step's sampled tokens into the books: one per `scheduler_output.sampled_seqs`, in order (a list
        of tokens for a verify entry: the guesses kept, then one more), and each one's logprobs (a dict, or None
        where not asked; requests that ask get no guesses). Returns the sequences that got tokens (finished
        ones included, `is_finished` set)."""
        sampled, advanced, now = iter(sampled_token_ids), [], time.perf_counter()
        logprobs = iter(sampled_logprobs or [])
        for entry in scheduler_output.entries:
            if not entry.samples:
                continue  # a prefill chunk before the prompt's end: nothing to sample yet
            for seq in (entry.seq, *entry.forks):
                new_tokens, new_logprobs = next(sampled), next(logprobs, None)
                seq.num_output_placeholders -= 1
                if not seq.is_finished:  # (finished (stop, abort) while this step was in flight: token dropped)
                    self._append(seq, entry, new_tokens, new_logprobs, now)
                    advanced.append(seq)
        return advanced

    def _append(self, seq: Sequence, entry: ScheduledSequence, new_tokens, new_logprobs, now: float) -> None:
        """One sequence's tokens from the step (a list for a verify entry), its stop conditions applied."""
        if isinstance(new_tokens, int):
            new_tokens = [new_tokens]
        if entry.draft_token_ids:
            kept = len(new_tokens) - 1
            self.num_drafts += 1
            self.num_draft_tokens += len(entry.draft_token_ids)
            self.num_accepted_tokens += kept
            # For adaptive guessing: an average over the last few steps (half the weight on this one).
            seq.recent_accepted = kept if seq.recent_accepted is None else (seq.recent_accepted + kept) / 2
            # The kept guesses were computed from the right tokens: their keys and values stay.
            seq.num_computed_tokens += kept
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = now
        for token in new_tokens:
            seq.token_ids.append(token)
            if new_logprobs is not None:
                seq.logprobs.append(new_logprobs)
            if seq.grammar is not None and not seq.grammar.accept_token(token):
                # The mask lets only what the grammar accepts through, unless it allowed no token at all (a
                # vocabulary that cannot spell the grammar): the answer cannot go on.
                self.finish(seq, "stop")
                break
            reason = self._stop_reason(seq, token)
            if reason is not None:  # tokens after a stop are not part of the answer
                self.finish(seq, reason)
                break
        if not seq.is_finished:
            self.blocks.cache_full_blocks(seq)  # a block the new tokens complete
            if entry.verify and self.blocks.free_tail(seq, len(seq)):  # the slots of guesses not kept
                left = len(seq.block_table)
                self._truncated[seq.request_id] = min(self._truncated.get(seq.request_id, left), left)

    def discard_output(self, scheduler_output: SchedulerOutput) -> None:
        """A step whose requests all ended while it was in flight: its tokens would all be dropped, so
        nobody waits for them; only their placeholders are given back."""
        for seq in scheduler_output.sampled_seqs:
            seq.num_output_placeholders -= 1

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if token in seq.params.stop_token_ids or (not seq.params.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if seq.grammar is not None and seq.grammar.is_terminated:  # the answer is complete (even with ignore_eos)
            return "stop"
        if seq.num_output_tokens >= seq.params.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """A sequence is done (stop, length or abort): it leaves and gives back its blocks."""
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        seq.metrics.finished_time = time.perf_counter()
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)
        request = seq.parent or seq  # n > 1: the request's id stays live until all its answers are done
        for done in {seq, request} if all(s.is_finished for s in request.group) else {seq} - {request}:
            if self.requests.get(done.request_id) is done:  # the id may already name a newer request
                del self.requests[done.request_id]
