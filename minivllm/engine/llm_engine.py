"""LLMEngine: requests in, one scheduled step at a time, outputs out. vLLM's engine API.

    >>> engine = LLMEngine(EngineConfig("smollm2-135m"))
    >>> engine.add_request("a", [1, 2, 3], SamplingParams(temperature=0, max_tokens=4))
    >>> while engine.has_unfinished_requests():
    ...     for out in engine.step():
    ...         print(out.request_id, out.outputs[0].token_ids, out.finished)

A step is: the scheduler picks sequences and how many tokens each computes -> the model
runner builds one flat batch and runs the model -> the sampler picks one token for every
sequence whose prompt is now complete -> stop conditions -> finished ones leave and give
back their KV blocks.

Every optimization is a switch here, so that an ablation is one argument:
`enable_paged_kv=False` gives each sequence one block of `max_model_len` tokens (the
contiguous cache of Hugging Face `generate`), `enable_continuous_batching=False` is static
batching, `enable_chunked_prefill` / `enable_prefix_caching` do what they say,
`attention_backend="torch"` swaps the fused Triton kernels for the readable reference, and
`enforce_eager=True` turns off the CUDA graphs of decode steps.

Bad input (an empty prompt, ids outside the vocabulary, a prompt that does not fit
`max_model_len`, a request that could never fit in the KV pool, a duplicate request id)
raises `ValueError` from `add_request` and changes nothing: other requests go on.
"""
from __future__ import annotations

import time
import warnings

import torch

from ..cache.block_manager import BlockManager, cdiv
from ..cache.kv_cache import allocate_kv_cache, kv_bytes_per_token, kv_cache_budget_bytes
from ..config import EngineConfig, resolve_dtype
from ..models.loader import build_model, generation_eos_ids, load_tokenizer, resolve_model
from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import SamplingParams
from .detokenizer import IncrementalDetokenizer
from .model_runner import ModelRunner
from .sampler import Sampler
from .scheduler import Scheduler
from .sequence import Sequence

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # a step's token budget when chunking: big enough to keep the GPU busy


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        source = resolve_model(config.model)
        self.model_config = cfg = source.config
        self.device = torch.device(config.device)
        self.dtype = resolve_dtype(config.dtype, cfg, config.device)
        self.max_model_len = config.max_model_len or cfg.max_position_embeddings
        if self.max_model_len > cfg.max_position_embeddings:  # RoPE tables and the model stop there
            raise ValueError(f"max_model_len={self.max_model_len} exceeds the model's "
                             f"{cfg.max_position_embeddings} positions (max_position_embeddings)")
        folder = None if config.load_format == "dummy" else source.folder
        self.model = build_model(cfg, self.device, self.dtype, self.max_model_len, folder, config.seed)
        self.model.use_backend(config.attention_backend)
        self.tokenizer = load_tokenizer(source.folder)
        self.eos_token_ids = set(generation_eos_ids(cfg, source.folder))

        self.max_num_batched_tokens = config.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
        if not config.enable_chunked_prefill:  # a whole prompt must fit in one step
            self.max_num_batched_tokens = max(self.max_num_batched_tokens, self.max_model_len)
        prefix_caching = config.enable_prefix_caching and config.enable_paged_kv
        if prefix_caching and cfg.sliding_window is not None:
            # As vLLM did: blocks released outside the window break the chain of cached prefix blocks.
            warnings.warn("prefix caching is turned off for models with a sliding window")
            prefix_caching = False
        self.block_size = config.block_size if config.enable_paged_kv else self.max_model_len

        self.runner = ModelRunner(self.model, self.block_size, self.device)
        num_blocks = self._num_kv_blocks()
        kv = allocate_kv_cache(cfg, num_blocks, self.block_size, self.dtype, self.device)
        for layer, (k_cache, v_cache) in zip(self.model.attention_layers(), kv):
            layer.bind_cache(k_cache, v_cache)
        if self.device.type == "cuda" and config.attention_backend == "triton" and not config.enforce_eager:
            self.runner.capture_cuda_graphs(config.max_num_seqs, self.max_model_len)
        self.block_manager = BlockManager(num_blocks, self.block_size, prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, self.max_num_batched_tokens,
                                   config.enable_chunked_prefill, cfg.sliding_window,
                                   continuous=config.enable_continuous_batching)
        self.sampler = Sampler(self.device, config.seed)
        self.requests: dict[str, Sequence] = {}

    def _num_kv_blocks(self) -> int:
        """KV capacity: what the user asked for, or what fits after a profiling forward."""
        config = self.config
        if config.num_kv_blocks is not None:
            tokens = config.num_kv_blocks * config.block_size
        else:
            if self.device.type == "cuda":
                # The peak must be this engine's own, not that of whatever ran before in the process.
                torch.cuda.reset_peak_memory_stats(self.device)
                self.runner.profile_run(self.max_num_batched_tokens, self.max_model_len)
            budget = kv_cache_budget_bytes(self.device, config.gpu_memory_utilization)
            tokens = budget // kv_bytes_per_token(self.model_config, self.dtype)
        num_blocks = tokens // self.block_size
        if num_blocks < 1:
            raise ValueError(f"the KV cache holds {tokens} tokens, less than one block of {self.block_size}: "
                             "lower max_model_len or block_size, or give the cache more memory")
        return num_blocks

    # ---- requests in -------------------------------------------------------------------
    def encode_prompt(self, prompt) -> tuple[str | None, list[int]]:
        """A str, a list of token ids, or {"prompt_token_ids": [...]} -> (text, token ids), validated."""
        text = None
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise ValueError("a dict prompt needs the key 'prompt_token_ids'")
            prompt = prompt["prompt_token_ids"]
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass token ids, not text")
            text, prompt = prompt, self.tokenizer.encode(prompt)
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"a prompt is a str, a list of int token ids or a dict; got {type(prompt).__name__}")
        if not prompt:
            raise ValueError("empty prompt: at least one token is needed")
        bad = [t for t in prompt if not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.model_config.vocab_size})")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room to generate within "
                             f"max_model_len={self.max_model_len}")
        return text, list(prompt)

    def _blocks_needed_at_most(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        tokens = min(num_prompt_tokens + params.max_tokens, self.max_model_len)
        window = self.model_config.sliding_window
        if window is not None:  # only the window and the step's new tokens are ever held
            return min(cdiv(tokens, self.block_size), cdiv(window + self.max_num_batched_tokens, self.block_size) + 1)
        return cdiv(tokens, self.block_size)

    def add_request(self, request_id: str, prompt, sampling_params: SamplingParams | None = None) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        text, token_ids = self.encode_prompt(prompt)
        need = self._blocks_needed_at_most(len(token_ids), params)
        if need > self.block_manager.num_total_blocks:
            raise ValueError(f"request needs up to {need} KV blocks but the pool has "
                             f"{self.block_manager.num_total_blocks}: it could never run")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none (use stop_token_ids)")
        seq = Sequence(request_id, token_ids, params, text, self.device)
        if self.tokenizer is not None:
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, params.stop)
        self.requests[request_id] = seq
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """End a request wherever it is (waiting, prefilling, decoding); its blocks come back.
        Returns its last output (finish_reason "abort"), or None for an unknown or finished id."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.finish(seq, "abort")
        seq.metrics.finished_time = time.perf_counter()
        return self._output(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- one step ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()
        if not scheduled.seqs:
            return []
        logits = self.runner.run(scheduled.seqs, scheduled.num_new_tokens)
        for seq, n in zip(scheduled.seqs, scheduled.num_new_tokens):
            seq.num_computed_tokens += n
            self.block_manager.cache_full_blocks(seq)
        # A sequence in the middle of its prompt (a prefill chunk) samples nothing yet.
        ready = [i for i, seq in enumerate(scheduled.seqs) if seq.num_computed_tokens == len(seq)]
        if not ready:
            return []
        seqs = [scheduled.seqs[i] for i in ready]
        if len(ready) < len(scheduled.seqs):  # indexing by a list is a host -> device copy: only when needed
            logits = logits[ready]
        next_tokens = self.sampler(logits, seqs).tolist()  # the step's one device -> host copy
        now = time.perf_counter()
        outputs = []
        for seq, token in zip(seqs, next_tokens):
            seq.token_ids.append(token)
            if seq.metrics.first_token_time is None:
                seq.metrics.first_token_time = now
            stopped_by_text = seq.detokenizer is not None and seq.detokenizer.add(token)
            reason = "stop" if stopped_by_text else self._stop_reason(seq, token)
            if reason is not None:
                seq.metrics.finished_time = now
                self.scheduler.finish(seq, reason)
                del self.requests[seq.request_id]
            outputs.append(self._output(seq))
        return outputs

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if token in seq.params.stop_token_ids or (not seq.params.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if seq.num_output_tokens >= seq.params.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    def _output(self, seq: Sequence) -> RequestOutput:
        # The text grows with every token (incremental detokenization), so a stream can show it.
        text = seq.detokenizer.text if seq.detokenizer is not None else ""
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids,
                             [CompletionOutput(0, text, seq.output_token_ids, seq.finish_reason)],
                             seq.is_finished, seq.metrics)

    def get_stats(self) -> dict:
        return {
            "num_total_blocks": self.block_manager.num_total_blocks,
            "num_free_blocks": self.block_manager.num_free_blocks,   # cached-but-unused blocks count as free
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "num_preemptions": self.scheduler.num_preemptions,
            "num_prefix_cache_hit_tokens": self.scheduler.num_prefix_cache_hit_tokens,
        }
