"""The draft-model proposer: a smaller model with the same vocabulary guesses k tokens, one forward per guess.

The draft has its own model runner and its own paged KV cache, with as many blocks as the target's and
the same block size, so it uses the target's block tables as they are: a token's keys and values sit at
the same slot in both caches. The scheduler has already reserved the slots of the k guesses, so before
the target's verify forward the draft runs:

1. one forward over every token of the sequence it has not computed yet (all of the prompt the first
   time; afterwards the tokens the last step accepted), which samples guess 1;
2. k - 1 forwards of one token each (guess i in, guess i + 1 out).

It samples its guesses as the target would sample (greedy, or the same temperature, top-k and top-p)
and returns their distributions `q`, which the rejection sampler needs. What the draft has computed is
remembered per request as the tokens it was fed: after a step, its keys and values stay valid for the
longest prefix those share with the sequence (guesses not kept are recomputed from the right tokens).

A draft made from the target itself (same folder) guesses exactly what the target picks: every guess is
kept (greedy), which the tests use to check the mechanics.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.scheduler import ScheduledSequence, SchedulerOutput
from ..models.loader import resolve_model
from ..worker.model_runner import ModelRunner
from ..worker.sampler import sampling_probs


@dataclass
class DraftView:
    """What the draft runner reads of a sequence (its id, tokens and block table), with guesses appended."""
    request_id: str
    token_ids: list[int]
    block_table: list[int]


class DraftModelProposer:
    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self._fed: dict[str, list[int]] = {}  # per request: the tokens whose keys and values the draft holds

    @classmethod
    def build(cls, model: str, target_runner_args: dict) -> DraftModelProposer:
        """The draft's runner on the target's device, dtype and sizes (its KV cache: `runner.initialize_kv_cache`)."""
        source = resolve_model(model)
        target_cfg = target_runner_args["model_config"]
        if source.config.vocab_size != target_cfg.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({source.config.vocab_size} tokens) is not the "
                             f"target's ({target_cfg.vocab_size}): a draft must share the target's tokenizer")
        return cls(ModelRunner(**(target_runner_args | dict(model_config=source.config, folder=source.folder))))

    @torch.inference_mode()
    def propose(self, scheduler_output: SchedulerOutput) -> torch.Tensor | None:
        """Fill every verify entry's guesses; returns their distributions [sampling sequences, k, vocab]."""
        # The target's block-table news reach the draft's table at every step, whether it guesses or not.
        self.runner.block_table.release(scheduler_output.released_request_ids)  # finished, aborted, preempted
        self.runner.block_table.truncate(scheduler_output.truncated_block_tables)
        for request_id in scheduler_output.released_request_ids:
            self._fed.pop(request_id, None)
        entries = scheduler_output.verifies
        if not entries:
            return None
        views, catch_up = [], []
        for e in entries:
            tokens, fed = e.seq.token_ids, self._fed.get(e.seq.request_id, [])
            valid = 0
            for a, b in zip(fed, tokens):  # keys and values stay valid up to the first difference
                if a != b:
                    break
                valid += 1
            valid = min(valid, len(tokens) - 1)  # the last token is always fed: its logits make guess 1
            view = DraftView(e.seq.request_id, list(tokens), e.seq.block_table)
            views.append(view)
            catch_up.append(ScheduledSequence(view, valid, len(tokens) - valid, True))
        step = SchedulerOutput(prefills=catch_up)
        active = list(range(len(entries)))
        guesses, q = self._sample(step, [entries[a] for a in active])
        k = max(e.num_tokens for e in entries) - 1
        all_q = torch.zeros(len(entries), k, q.shape[-1], dtype=q.dtype, device=q.device)
        for i in range(k):
            for a, guess, row in zip(active, guesses, q):
                entries[a].draft_token_ids.append(guess)
                all_q[a, i] = row
            # The next guess only for entries with room for it: their slots end at their own k.
            active = [a for a in active if len(entries[a].draft_token_ids) < entries[a].num_tokens - 1]
            if not active:
                break
            for a in active:
                views[a].token_ids.append(entries[a].draft_token_ids[-1])
            step = SchedulerOutput(decodes=[ScheduledSequence(views[a], len(views[a].token_ids) - 1, 1, True)
                                            for a in active])
            guesses, q = self._sample(step, [entries[a] for a in active])
        for e, view in zip(entries, views):
            self._fed[e.seq.request_id] = view.token_ids  # the last guess was sampled, not fed
        return self._aligned_probs(scheduler_output, entries, all_q)

    def _sample(self, step: SchedulerOutput, entries: list[ScheduledSequence]) -> tuple[list[int], torch.Tensor]:
        """One draft forward; each row's guess, drawn as the target would draw, and the distribution q."""
        logits = self.runner.execute_model(step)
        params = [e.seq.params for e in entries]
        per_row = torch.tensor([[p.temperature, p.top_k, p.top_p] for p in params], device=logits.device)
        q = sampling_probs(logits, per_row[:, 0], per_row[:, 1].long(), per_row[:, 2])
        races = torch.empty_like(q)
        for row, e in enumerate(entries):
            races[row].exponential_(generator=e.seq.generator or self.runner.sampler.generator)
        return (q / races).argmax(-1).tolist(), q

    @staticmethod
    def _aligned_probs(scheduler_output: SchedulerOutput, entries, q: torch.Tensor) -> torch.Tensor:
        """q [verify entries, k, V] -> [sampling sequences of the step, k, V], zeros for the others."""
        sampled = [e for e in scheduler_output.entries if e.samples]
        aligned = torch.zeros(len(sampled), *q.shape[1:], dtype=q.dtype, device=q.device)
        index = {id(e): i for i, e in enumerate(sampled)}
        aligned[[index[id(e)] for e in entries]] = q
        return aligned
