"""The draft-model proposer: a smaller model with the target's vocabulary proposes k draft tokens.

The draft's KV cache is shaped like the target's, so it reuses the target's block tables. Per step: one
forward over the tokens not yet in its cache, then k - 1 single-token forwards.
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
    """A sequence plus its draft tokens, for the draft runner."""
    request_id: str
    token_ids: list[int]
    block_table: list[int]


class DraftModelProposer:
    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self._fed: dict[str, list[int]] = {}  # tokens in the draft's KV cache, per request

    @classmethod
    def build(cls, model: str, target_runner_args: dict) -> DraftModelProposer:
        """A draft runner with the target's runner arguments."""
        source = resolve_model(model)
        target_cfg = target_runner_args["model_config"]
        if source.config.vocab_size != target_cfg.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({source.config.vocab_size} tokens) is not the "
                             f"target's ({target_cfg.vocab_size}): a draft must share the target's tokenizer")
        return cls(ModelRunner(**(target_runner_args | dict(model_config=source.config, folder=source.folder))))

    @torch.inference_mode()
    def propose(self, scheduler_output: SchedulerOutput) -> torch.Tensor | None:
        """Fill every verify entry's draft tokens; return their distributions [sampling sequences, k, vocab]."""
        # Mirror the target's block tables every step.
        self.runner.block_table.release(scheduler_output.released_request_ids)
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
            for a, b in zip(fed, tokens):  # the KV cache is valid up to the first mismatch
                if a != b:
                    break
                valid += 1
            valid = min(valid, len(tokens) - 1)  # the last token's logits give draft token 1
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
            active = [a for a in active if len(entries[a].draft_token_ids) < entries[a].num_tokens - 1]
            if not active:
                break
            for a in active:
                views[a].token_ids.append(entries[a].draft_token_ids[-1])
            step = SchedulerOutput(decodes=[ScheduledSequence(views[a], len(views[a].token_ids) - 1, 1, True)
                                            for a in active])
            guesses, q = self._sample(step, [entries[a] for a in active])
        for e, view in zip(entries, views):
            self._fed[e.seq.request_id] = view.token_ids  # excludes the last draft token, never fed
        return self._aligned_probs(scheduler_output, entries, all_q)

    def _sample(self, step: SchedulerOutput, entries: list[ScheduledSequence]) -> tuple[list[int], torch.Tensor]:
        """One draft forward: each row's draft token and distribution q."""
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
        """q [verify entries, k, V] -> [sampling sequences, k, V], zeros elsewhere."""
        sampled = [e for e in scheduler_output.entries if e.samples]
        aligned = torch.zeros(len(sampled), *q.shape[1:], dtype=q.dtype, device=q.device)
        index = {id(e): i for i, e in enumerate(sampled)}
        aligned[[index[id(e)] for e in entries]] = q
        return aligned
