"""LLMEngine: requests in, one scheduled step at a time, outputs out. vLLM's engine API.

    >>> engine = LLMEngine.from_config(EngineConfig("smollm2-135m"))
    >>> engine.add_request("a", [1, 2, 3], SamplingParams(temperature=0, max_tokens=4))
    >>> while engine.has_unfinished_requests():
    ...     for out in engine.step():
    ...         print(out.request_id, out.outputs[0].token_ids, out.finished)

A step reads straight through: schedule (the scheduler picks sequences and how many tokens each
computes) -> execute (the model runner builds one flat batch and runs the model) -> sample (one
token for every sequence whose known tokens are all computed) -> update (the scheduler appends the
tokens, applies the stop conditions, finishes sequences, gives back their blocks) -> outputs (text
grows, stop strings end requests).

With `async_scheduling` (the default) the CPU and the GPU overlap: `step()` queues step n+1 on the
GPU before it waits for step n's tokens, then updates the books and returns step n's outputs while
the GPU works on step n+1. Each call still returns one step's outputs; a request added or aborted
now meets a step already in flight (an aborted request's token from it is dropped). Greedy outputs
are the same either way (a test holds them equal).

Structured outputs (`SamplingParams.structured_outputs`): a request's grammar is compiled when it is added
(`minivllm.structured_output`); a step that samples for constrained requests masks their logits with the
grammars' bitmask, filled on the CPU while the GPU runs that step's forward (`_launch`), so the overlap stays.

Every optimization is a switch here, so that an ablation is one argument:
`enable_paged_kv=False` gives each sequence one block of `max_model_len` tokens (the
contiguous cache of Hugging Face `generate`), `enable_continuous_batching=False` is static
batching, `enable_chunked_prefill` / `enable_prefix_caching` do what they say,
`attention_backend="torch"` swaps the fused Triton kernels for the readable reference,
`enforce_eager=True` turns off the CUDA graphs (of decode and verify steps), and `async_scheduling=False`
runs the CPU's work and the GPU's one after the other. `tensor_parallel_size=N` splits the model
over N GPUs: this process is rank 0 and starts the other ranks' processes; `shutdown()` stops them.

Bad input (an empty prompt, ids outside the vocabulary, a prompt that does not fit
`max_model_len`, a request that could never fit in the KV pool, a duplicate request id)
raises `ValueError` from `add_request` (the checks live in `input_processor.py`) and changes
nothing: other requests go on.
"""
from __future__ import annotations

import warnings

import torch

from ..config import EngineConfig, resolve_dtype
from ..core.block_manager import BlockManager
from ..core.detokenizer import IncrementalDetokenizer
from ..core.scheduler import Scheduler, SchedulerOutput
from ..core.sequence import Sequence
from ..distributed.parallel_state import check_divisible, tp_size
from ..executor import Executor, make_executor
from ..models.loader import generation_eos_ids, load_tokenizer, resolve_model
from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import SamplingParams
from ..spec_decode import DraftModelProposer, make_proposer
from ..structured_output import StructuredOutputManager
from ..worker.kv_cache import kv_bytes_per_token
from ..worker.model_runner import ModelRunner, SampledTokens
from .input_processor import InputProcessor

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # a step's token budget when chunking: big enough to keep the GPU busy


class LLMEngine:
    """The step loop over its parts: a scheduler (the books), an executor (the model, on one rank or N) and
    an input processor (requests checked at the door; its tokenizer, if any, also makes the outputs' text).
    `from_config` builds the parts from an `EngineConfig`; tests and notebooks may compose their own."""

    def __init__(self, config: EngineConfig, scheduler: Scheduler, executor: Executor, input_processor: InputProcessor,
                 proposer=None, structured_output: StructuredOutputManager | None = None):
        self.config = config
        self.scheduler = scheduler
        self.executor = executor
        self.input_processor = input_processor
        self.proposer = proposer  # speculative decoding: fills each verify entry's guesses (None: no guesses)
        self.structured_output = structured_output  # grammars of structured outputs (None: refused)
        # The step launched on the GPU whose tokens the host has not read yet (async scheduling).
        self._in_flight: tuple[SchedulerOutput, SampledTokens] | None = None

    @classmethod
    def from_config(cls, config: EngineConfig, detokenize: bool = True) -> LLMEngine:
        """Resolve the model, start the executor (and its worker processes), size the KV pool from a profiling
        forward, allocate it, capture the CUDA graphs, and build the scheduler. Without `detokenize` (the
        engine core of a server: its frontend makes the text) no tokenizer is loaded."""
        source = resolve_model(config.model)
        cfg = source.config
        dtype = resolve_dtype(config.dtype, cfg, config.device)
        max_model_len = config.max_model_len or cfg.max_position_embeddings
        if max_model_len > cfg.max_position_embeddings:  # RoPE tables and the model stop there
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's "
                             f"{cfg.max_position_embeddings} positions (max_position_embeddings)")
        tokenizer = load_tokenizer(source.folder) if detokenize else None

        max_num_batched_tokens = config.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
        if not config.enable_chunked_prefill:  # a whole prompt must fit in one step
            max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
        prefix_caching = config.enable_prefix_caching and config.enable_paged_kv
        if prefix_caching and cfg.sliding_window is not None:
            # As vLLM did: blocks released outside the window break the chain of cached prefix blocks.
            warnings.warn("prefix caching is turned off for models with a sliding window")
            prefix_caching = False
        block_size = config.block_size if config.enable_paged_kv else max_model_len
        eos_token_ids = generation_eos_ids(cfg, source.folder)

        if tp_size() > 1:  # the layers read the group of this process: it can hold one split model only
            raise RuntimeError("a tensor-parallel engine is running in this process: shut it down "
                               "(LLM.shutdown()) before starting another engine")
        if config.tensor_parallel_size > 1:
            check_divisible(cfg.num_heads, cfg.num_kv_heads, config.tensor_parallel_size)  # before any process
        runner_args = dict(model_config=cfg, device=config.device, dtype=dtype, max_model_len=max_model_len,
                           block_size=block_size, max_num_seqs=config.max_num_seqs,
                           folder=None if config.load_format == "dummy" else source.folder, seed=config.seed,
                           backend=config.attention_backend, gpu_memory_limit_bytes=config.gpu_memory_limit_bytes,
                           eos_token_ids=tuple(eos_token_ids))
        executor = make_executor(runner_args, config.tensor_parallel_size, config.device)
        try:  # a failure from here on stops the workers already started
            spec = config.speculative_config
            # A draft model's weights load before the KV pool is sized, so the profile counts them.
            proposer = make_proposer(spec, runner_args) if spec is not None else None
            if config.num_kv_blocks is not None:
                num_blocks = config.num_kv_blocks * config.block_size // block_size
            else:  # what fits after a profiling forward
                num_blocks = executor.collective_rpc("num_kv_blocks_that_fit", config.gpu_memory_utilization,
                                                     max_num_batched_tokens)
            if num_blocks < 1:
                raise ValueError(f"the KV cache holds less than one block of {block_size} tokens: "
                                 "lower max_model_len or block_size, or give the cache more memory")
            if isinstance(proposer, DraftModelProposer):  # its cache has as many blocks as the target's
                if config.num_kv_blocks is None:  # the memory was sized for the target's cache alone: share it
                    target, draft = (kv_bytes_per_token(c, dtype) for c in (cfg, proposer.runner.model_config))
                    num_blocks = num_blocks * target // (target + draft)
                proposer.runner.initialize_kv_cache(num_blocks)
            executor.collective_rpc("initialize_kv_cache", num_blocks)
            runner = executor.runner
            if runner.device.type == "cuda" and runner.attn_backend.supports_cuda_graphs and not config.enforce_eager:
                # Verify steps of k + 1 tokens per sequence too; a draft model's runner captures the same shapes:
                # its guesses are decodes, its catch-up after a verify a few tokens per sequence.
                executor.collective_rpc("capture_cuda_graphs", config.num_speculative_tokens)
                if isinstance(proposer, DraftModelProposer):
                    proposer.runner.capture_cuda_graphs(config.num_speculative_tokens)
        except BaseException:
            executor.shutdown()
            raise
        scheduler = Scheduler(BlockManager(num_blocks, block_size, prefix_caching), config.max_num_seqs,
                              max_num_batched_tokens, max_model_len, eos_token_ids,
                              config.enable_chunked_prefill, cfg.sliding_window,
                              continuous=config.enable_continuous_batching,
                              num_lookahead_tokens=config.num_speculative_tokens,
                              spec_disable_by_batch_size=spec.disable_by_batch_size if spec else None,
                              spec_adaptive=spec.adaptive if spec else False)
        input_processor = InputProcessor(tokenizer, cfg.vocab_size, max_model_len, block_size, num_blocks,
                                         max_num_batched_tokens, cfg.sliding_window)
        # Grammars need the tokenizer's vocabulary: loaded (by an engine core without one) on the first use only.
        structured_output = StructuredOutputManager(cfg.vocab_size, eos_token_ids,
                                                    lambda: tokenizer or load_tokenizer(source.folder),
                                                    pin_memory=executor.runner.use_async_copies)
        return cls(config, scheduler, executor, input_processor, proposer, structured_output)

    # ---- what the parts know -------------------------------------------------------------
    @property
    def runner(self) -> ModelRunner:
        """Rank 0's model runner, the one in this process."""
        return self.executor.runner

    @property
    def model(self):
        return self.runner.model

    @property
    def model_config(self):
        return self.runner.model_config

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.runner.dtype

    @property
    def tokenizer(self):
        return self.input_processor.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    @property
    def max_num_batched_tokens(self) -> int:
        return self.scheduler.max_num_batched_tokens

    @property
    def block_size(self) -> int:
        return self.scheduler.blocks.block_size

    @property
    def block_manager(self) -> BlockManager:
        return self.scheduler.blocks

    @property
    def requests(self) -> dict[str, Sequence]:
        """Live requests by id (the scheduler's books)."""
        return self.scheduler.requests

    # ---- requests in -------------------------------------------------------------------
    def add_request(self, request_id: str, prompt, sampling_params: SamplingParams | None = None) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, token_ids, params = self.input_processor.process(prompt, sampling_params)
        if params.n > self.scheduler.max_num_seqs:
            raise ValueError(f"n={params.n} answers do not fit in max_num_seqs={self.scheduler.max_num_seqs}")
        seq = Sequence(request_id, token_ids, params, text, self.device)
        if params.structured_outputs is not None:  # compiled now (or found in the cache): never mid-step
            if self.structured_output is None:
                raise ValueError("structured_outputs: this engine was built without a grammar manager")
            seq.grammar = self.structured_output.grammar_for(params.structured_outputs)
        if self.tokenizer is not None:
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, params.stop)
        self.scheduler.add(seq)

    def abort_request(self, request_id: str, index: int | None = None) -> RequestOutput | None:
        """End a request wherever it is (waiting, prefilling, decoding, in a step in flight); its
        blocks come back. Returns its last output (finish_reason "abort"), or None for an unknown
        or finished id. n > 1: every answer, or only answer `index` (a stop string ended it)."""
        seq = self.requests.get(request_id)
        if seq is None or seq.parent is not None:  # (an answer's own id is the engine's, not a request's)
            return None
        for answer in seq.group:  # (those already finished stay as they are)
            if not answer.is_finished and index in (None, answer.index):
                self.scheduler.finish(answer, "abort")
        return self._output(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- one step ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Advance every scheduled request by one step; the outputs of those that advanced.

        With async scheduling the next step is already on the GPU when this returns: each call launches
        step n+1, then waits for step n and returns its outputs (the first call launches two steps)."""
        if not self.config.async_scheduling:
            # (A step still in flight, from before the switch was turned off, is finished first.)
            launched, self._in_flight = self._in_flight or self._launch()[0], None
            return self._process(launched) if launched else []
        self._discard_stale_step()
        if self._in_flight is None:
            self._in_flight = self._launch()[0]
            if self._in_flight is None:
                return []
        done = self._in_flight
        self._in_flight, outputs = self._launch(done)  # step n+1 is queued before we wait for step n
        if outputs is None:
            outputs = self._process(done)
        self._discard_stale_step()  # e.g. the last requests just ended: nothing is left to wait for
        return outputs

    def _discard_stale_step(self) -> None:
        """Forget the step in flight if every request in it has ended meanwhile (finished, aborted)."""
        if self._in_flight is not None and all(seq.is_finished for seq in self._in_flight[0].seqs):
            self.scheduler.discard_output(self._in_flight[0])
            self._in_flight = None

    def _launch(self, in_flight: tuple[SchedulerOutput, SampledTokens] | None = None
                ) -> tuple[tuple[SchedulerOutput, SampledTokens] | None, list[RequestOutput] | None]:
        """Schedule -> execute -> sample, without waiting for the GPU; returns the step launched (None: nothing
        to run) and, if it had to process the step `in_flight` first, that step's outputs (else None).

        Structured outputs: a constrained row may only be sampled once its grammar has accepted the token of the
        step in flight. So, only when the new step samples for a request with a grammar, its forward is queued
        first, then the host waits for the step in flight, updates the books (the matchers accept their
        tokens), and fills the grammars' bitmask on the CPU while the GPU runs the forward; then it samples.
        The GPU waits only if this host work (the books, the mask) outlasts the forward; in a batch that mixes
        constrained and plain requests, every row's sampling waits for it. Other steps go as before."""
        scheduler_output = self.scheduler.schedule()
        if not scheduler_output:
            return None, None
        draft_probs = self.proposer.propose(scheduler_output) if self.proposer is not None else None
        logits = self.executor.execute_model(scheduler_output)
        outputs, bitmask, seqs = None, None, scheduler_output.sampled_seqs
        if any(seq.grammar is not None for seq in seqs):
            if in_flight is not None:
                outputs = self._process(in_flight)
            bitmask = self.structured_output.grammar_bitmask(seqs)
        return (scheduler_output, self.executor.sample(logits, scheduler_output, draft_probs, bitmask)), outputs

    def _process(self, launched: tuple[SchedulerOutput, SampledTokens]) -> list[RequestOutput]:
        """Update -> outputs: wait for the step's tokens, put them in the books, grow the text."""
        scheduler_output, sampled = launched
        tokens = sampled.tolist()
        per_row, prompt = sampled.logprobs() or (None, [])
        for seq, first, dicts in prompt:  # position p: prompt token p + 1 (a recomputed chunk adds nothing)
            have = len(seq.prompt_logprobs) - first - 1
            if have >= 0:
                seq.prompt_logprobs.extend(self._decoded(d) for d in dicts[have:])
        seqs = self.scheduler.update_from_output(scheduler_output, tokens, per_row)
        for seq in seqs:  # a stop string ends the request (the text stops before it)
            if seq.detokenizer is not None:
                self._detokenize(seq)
        requests = {id(r): r for r in (seq.parent or seq for seq in seqs)}  # n > 1: one output per request
        return [self._output(r) for r in requests.values()]

    def _decoded(self, logprobs: dict) -> dict:
        """Each token of one position's logprobs decoded alone (vLLM's decoded_token), with a tokenizer."""
        if self.tokenizer is not None:
            for token_id, logprob in logprobs.items():
                logprob.decoded_token = self.tokenizer.decode([token_id])
        return logprobs

    def _detokenize(self, seq: Sequence) -> None:
        """The text grows by the step's new tokens (several with speculation); a stop string ends it."""
        detokenizer = seq.detokenizer
        new_tokens = seq.token_ids[seq.num_prompt_tokens + detokenizer.num_added:]
        if seq.logprobs is not None:  # the new tokens' logprobs, decoded once
            for logprobs in seq.logprobs[len(seq.logprobs) - len(new_tokens):]:
                self._decoded(logprobs)
        for i, token in enumerate(new_tokens):
            if detokenizer.add(token):
                del seq.token_ids[len(seq.token_ids) - len(new_tokens) + i + 1:]  # tokens after it: not the answer
                if seq.logprobs is not None:
                    del seq.logprobs[seq.num_output_tokens:]
                if seq.is_finished:  # the same token also reached a length limit
                    seq.finish_reason = "stop"
                else:
                    self.scheduler.finish(seq, "stop")
                return

    def _output(self, seq: Sequence) -> RequestOutput:
        """The request's output: one CompletionOutput per answer (n; those not forked yet are empty)."""
        answers = [self._completion(s) for s in seq.group]
        answers += [CompletionOutput(i, "", [], seq.finish_reason, None if seq.logprobs is None else [])
                    for i in range(len(answers), seq.params.n)]
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids, answers,
                             all(a.finish_reason is not None for a in answers), seq.metrics, seq.prompt_logprobs)

    @staticmethod
    def _completion(seq: Sequence) -> CompletionOutput:
        # The text grows with every token (incremental detokenization), so a stream can show it.
        text = seq.detokenizer.text if seq.detokenizer is not None else ""
        logprobs = None if seq.logprobs is None else list(seq.logprobs)  # a snapshot, as token_ids is
        return CompletionOutput(seq.index, text, seq.output_token_ids, seq.finish_reason, logprobs)

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do with one rank). The engine is unusable after."""
        self.executor.shutdown()

    def get_stats(self) -> dict:
        return {
            "num_total_blocks": self.block_manager.num_total_blocks,
            "num_free_blocks": self.block_manager.num_free_blocks,   # cached-but-unused blocks count as free
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "num_preemptions": self.scheduler.num_preemptions,
            "num_prefix_cache_hit_tokens": self.scheduler.num_prefix_cache_hit_tokens,
            # Speculative decoding (zeros without it): verify steps with guesses, guesses, guesses kept.
            "num_drafts": self.scheduler.num_drafts,
            "num_draft_tokens": self.scheduler.num_draft_tokens,
            "num_accepted_tokens": self.scheduler.num_accepted_tokens,
        }
