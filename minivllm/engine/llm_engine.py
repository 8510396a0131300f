"""LLMEngine: requests in, one scheduled step at a time, outputs out. vLLM's engine API.

    >>> engine = LLMEngine(EngineConfig("smollm2-135m"))
    >>> engine.add_request("a", [1, 2, 3], SamplingParams(temperature=0, max_tokens=4))
    >>> while engine.has_unfinished_requests():
    ...     for out in engine.step():
    ...         print(out.request_id, out.outputs[0].token_ids, out.finished)

A step is: the scheduler picks sequences -> the model runner builds one flat batch and runs
the model -> the sampler picks one token per sequence -> each sequence is checked against
its stop conditions -> finished ones leave and give back their KV cache.

Bad input (an empty prompt, ids outside the vocabulary, a prompt that does not fit
`max_model_len`, a duplicate request id) raises `ValueError` from `add_request` and
changes nothing: the requests already in the engine go on.
"""
from __future__ import annotations

import time

import torch

from ..cache import ContiguousCacheManager, allocate_kv_cache, kv_bytes_per_token
from ..cache.kv_cache import kv_cache_budget_bytes
from ..config import EngineConfig, resolve_dtype
from ..models.loader import build_model, generation_eos_ids, load_tokenizer, resolve_model
from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import SamplingParams
from .model_runner import ModelRunner
from .sampler import Sampler
from .sequence import Sequence
from .static_scheduler import StaticScheduler

DEFAULT_PROFILE_TOKENS = 8192  # the largest step the memory profile plans for


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        source = resolve_model(config.model)
        self.model_config = cfg = source.config
        self.device = torch.device(config.device)
        self.dtype = resolve_dtype(config.dtype, cfg, config.device)
        self.max_model_len = config.max_model_len or cfg.max_position_embeddings
        folder = None if config.load_format == "dummy" else source.folder
        self.model = build_model(cfg, self.device, self.dtype, self.max_model_len, folder, config.seed)
        self.tokenizer = load_tokenizer(source.folder)
        self.eos_token_ids = set(generation_eos_ids(cfg, source.folder))

        self.runner = ModelRunner(self.model, self.max_model_len, self.device)
        # The contiguous cache: a row of max_model_len slots per sequence, as many rows as fit.
        if config.num_kv_blocks is not None:
            capacity_tokens = config.num_kv_blocks * config.block_size
        else:
            if self.device.type == "cuda":
                self.runner.profile_run(config.max_num_batched_tokens or DEFAULT_PROFILE_TOKENS, self.max_model_len)
            capacity_tokens = kv_cache_budget_bytes(self.device, config.gpu_memory_utilization) // kv_bytes_per_token(
                cfg, self.dtype)
        num_rows = min(config.max_num_seqs, capacity_tokens // self.max_model_len)
        if num_rows < 1:
            raise ValueError(f"the KV cache holds {capacity_tokens} tokens, less than one sequence of "
                             f"max_model_len={self.max_model_len}: lower max_model_len or raise the cache size")
        kv = allocate_kv_cache(cfg, num_rows, self.max_model_len, self.dtype, self.device)
        for layer, (k_cache, v_cache) in zip(self.model.attention_layers(), kv):
            layer.bind_cache(k_cache, v_cache)
        self.cache = ContiguousCacheManager(num_rows)
        self.scheduler = StaticScheduler(self.cache, config.max_num_seqs)
        self.sampler = Sampler(self.device, config.seed)
        self.requests: dict[str, Sequence] = {}

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

    def add_request(self, request_id: str, prompt, sampling_params: SamplingParams | None = None) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        text, token_ids = self.encode_prompt(prompt)
        seq = Sequence(request_id, token_ids, params, text, self.device)
        self.requests[request_id] = seq
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        seq = self.requests.pop(request_id, None)
        if seq is not None and not seq.is_finished:
            self.scheduler.finish(seq, "abort")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- one step ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        seqs = self.scheduler.schedule()
        if not seqs:
            return []
        logits = self.runner.run(seqs, [s.num_uncomputed_tokens for s in seqs])
        next_tokens = self.sampler(logits, seqs).tolist()  # the step's one device -> host copy
        now = time.perf_counter()
        outputs = []
        for seq, token in zip(seqs, next_tokens):
            seq.num_computed_tokens = len(seq)
            seq.token_ids.append(token)
            if seq.metrics.first_token_time is None:
                seq.metrics.first_token_time = now
            reason = self._stop_reason(seq, token)
            if reason is not None:
                seq.metrics.finished_time = now
                self.scheduler.finish(seq, reason)
                del self.requests[seq.request_id]
            outputs.append(self._output(seq))
        return outputs

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if token in seq.params.stop_token_ids or (not seq.params.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if len(seq.output_token_ids) >= seq.params.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    def _output(self, seq: Sequence) -> RequestOutput:
        ids = seq.output_token_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer else ""
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids,
                             [CompletionOutput(0, text, ids, seq.finish_reason)], seq.is_finished, seq.metrics)

    def get_stats(self) -> dict:
        return {
            "num_total_blocks": self.cache.num_total_blocks,
            "num_free_blocks": self.cache.num_free_blocks,
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "num_preemptions": 0,               # static batching never preempts
            "num_prefix_cache_hit_tokens": 0,   # and has no prefix cache
        }
