"""AsyncScheduler: plans step n+1 before step n's sampled tokens have reached the host (vLLM's name).

A sequence that samples at step n gets a *placeholder* (`num_output_placeholders`): a token known to
exist, its id still on the GPU. Its decode at step n+1 is planned at the right position and the model
runner takes the id from the device. So the CPU prepares the next step while the GPU runs this one.
"""
from __future__ import annotations

from .scheduler import Scheduler, SchedulerOutput
from .sequence import Sequence


class AsyncScheduler(Scheduler):
    def _may_decode(self, seq: Sequence) -> bool:
        # A token in flight that surely ends the sequence (a length limit): no step after it.
        return not (seq.num_output_placeholders > 0 and (
            seq.num_output_tokens + seq.num_output_placeholders >= seq.params.max_tokens
            or seq.num_tokens >= self.max_model_len))

    def _may_admit(self, seq: Sequence) -> bool:
        # Preempted while its last token was in flight: that id must reach the host before it is recomputed.
        return seq.num_output_placeholders == 0

    def _on_sample_scheduled(self, seq: Sequence) -> None:
        seq.num_output_placeholders += 1

    def _on_sample_returned(self, seq: Sequence) -> None:
        seq.num_output_placeholders -= 1

    def discard_output(self, scheduler_output: SchedulerOutput) -> None:
        """A step whose requests all ended while it was in flight: nobody waits for its tokens."""
        for seq in scheduler_output.sampled_seqs:
            seq.num_output_placeholders -= 1
