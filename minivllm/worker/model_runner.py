"""The model runner: owns the model, its KV cache and CUDA graphs, and runs each step.

`execute_model` packs a `SchedulerOutput` into one flat batch (tokens, positions, cache slots), runs the
model once and returns the logits of the sampling rows. Decode and verify steps, and mixed steps up to a few
thousand tokens, replay a CUDA graph (cuda_graphs.py); larger steps run eagerly. `sample` picks the next
tokens on the device.

Steps without draft tokens do not wait for the GPU, so the CPU can prepare step n+1 while step n runs: inputs
travel in one async copy from pinned memory, a token still being sampled is read from `_last_sampled` on
the device, and sampled ids come back on a side stream. Verify steps wait: the rejection sampler calls
`.tolist()`. With tensor parallelism each rank has a runner; rank 0 broadcasts the batch and samples.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from ..attention import AttentionMetadata, NoCacheMetadata
from ..core.block_manager import cdiv
from ..core.scheduler import SchedulerOutput
from ..distributed.parallel_state import cpu_group, tp_size
from ..models.loader import build_model
from ..structured_output import GrammarBitmask
from .block_table import BlockTable
from .cuda_graphs import CUDAGraphs, choose_graph, choose_size, graph_ladders, token_ladder
from .kv_cache import allocate_kv_cache, kv_bytes_per_token, kv_cache_budget_bytes
from .logprobs import StepLogprobs, compute_logprobs
from .rejection_sampler import RejectionSampler
from .sampler import Sampler, process_logits


class SampledTokens:
    """A step's sampled token ids (and logprobs, if requested) being copied to the host."""

    def __init__(self, tokens: torch.Tensor, copy_stream, logprobs: StepLogprobs | None = None):
        self._ready, self._logprobs, self._num_rows = None, logprobs, tokens.shape[0]
        tensors = [tokens] + (logprobs.tensors if logprobs is not None else [])
        if not tokens.is_cuda:
            self._host = tensors
            return
        self._host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
        copy_stream.wait_stream(torch.cuda.current_stream(tokens.device))
        with torch.cuda.stream(copy_stream):
            for host, t in zip(self._host, tensors):
                host.copy_(t, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record(copy_stream)
        for t in tensors:
            t.record_stream(copy_stream)  # keep the allocator from reusing them mid-copy

    def tolist(self) -> list[int]:
        """The ids, waiting for this copy only."""
        if self._ready is not None:
            self._ready.synchronize()
        return self._host[0].tolist()

    def logprobs(self):
        """After `tolist`: the step's logprobs on the host, or None if none were requested."""
        return self._logprobs.on_host(self._host[1:], self._num_rows) if self._logprobs is not None else None


class VerifiedTokens:
    """A verify step's tokens, on the host: per sequence, its accepted draft tokens plus one."""

    def __init__(self, tokens: list[list[int]], logprobs: StepLogprobs | None = None):
        self._tokens, self._logprobs = tokens, logprobs

    def tolist(self) -> list[list[int]]:
        return self._tokens

    def logprobs(self):
        if self._logprobs is None:
            return None
        return self._logprobs.on_host([t.cpu() for t in self._logprobs.tensors], len(self._tokens))


# A step's integers, in the order they sit in the one flat int64 tensor that travels to the device.
BATCH_FIELDS = ("input_ids", "positions", "slot_mapping", "cu_seqlens", "context_lens", "sample_index",
                "from_device_dst", "from_device_src", "block_tables")


@dataclass
class BatchLayout:
    """How to cut the flat int64 batch tensor back into a step's inputs."""
    field_sizes: dict[str, int]  # BATCH_FIELDS, in order
    num_seqs: int
    table_width: int
    max_query_len: int
    max_context_len: int
    num_decodes: int
    max_decode_context_len: int
    every_row_samples: bool = False  # sample_index is 0 .. T-1

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(zip(self.field_sizes, flat.split(list(self.field_sizes.values()))))


class InputBatch(NamedTuple):
    """One step's inputs on the device."""
    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    sample_index: torch.Tensor  # rows whose logits are kept: the sampling rows, then the prompt-logprob rows


class ModelRunner:
    def __init__(self, model_config, device, dtype, max_model_len: int, block_size: int, max_num_seqs: int,
                 folder=None, seed: int = 0, backend: str = "torch", gpu_memory_limit_bytes: int | None = None,
                 eos_token_ids=(), quantization: str | None = None, kv_cache_dtype: torch.dtype | None = None):
        self.model_config = model_config
        self.device = torch.device(device)
        if self.device.type == "cuda" and tp_size() > 1:
            torch.cuda.set_device(self.device)
        self.dtype = dtype
        self.kv_cache_dtype = kv_cache_dtype or dtype
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.gpu_memory_limit_bytes = gpu_memory_limit_bytes
        self.model = build_model(model_config, self.device, dtype, max_model_len, folder, seed, backend, quantization)
        self.attn_backend = self.model.attn_backend
        self.sampler = Sampler(self.device, seed, eos_token_ids)
        self.rejection_sampler = RejectionSampler(self.device, self.sampler.generator)
        self.block_table = BlockTable(max_num_seqs, cdiv(max_model_len, block_size))
        self.graphs: CUDAGraphs | None = None
        self.max_mixed_graph_tokens = 0     # mixed steps up to this many tokens are graphed (`reserve_graph_memory`)
        self.graph_memory_bytes = 0         # kept out of the KV cache (`reserve_graph_memory`)
        self.graph_replays = Counter()  # "decode" / "verify" / "mixed" -> count
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer
        self.use_async_copies = self.device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(self.device) if self.use_async_copies else None
        # The last step's sampled ids, on the device, and each request's row in them.
        self._last_sampled = torch.zeros(0, dtype=torch.int64, device=self.device)
        self._last_sampled_rows: dict[str, int] = {}

    # ---- set-up (every rank runs these) ----
    def num_kv_blocks_that_fit(self, gpu_memory_utilization: float, max_num_batched_tokens: int,
                               kv_cache_memory_bytes: int | None = None) -> int:
        """KV blocks in `kv_cache_memory_bytes` if given, else those that fit after the weights and the peak
        activations of a profiling forward."""
        if kv_cache_memory_bytes is not None:
            budget = kv_cache_memory_bytes
        else:
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
                self._profile_run(max_num_batched_tokens)
            budget = kv_cache_budget_bytes(self.device, gpu_memory_utilization, self.gpu_memory_limit_bytes)
            budget -= self.graph_memory_bytes
        num_blocks = budget // kv_bytes_per_token(self.model_config, self.kv_cache_dtype) // self.block_size
        if tp_size() > 1:  # all ranks use the smallest pool
            fewest = torch.tensor([num_blocks])
            dist.all_reduce(fewest, op=dist.ReduceOp.MIN, group=cpu_group())
            num_blocks = int(fewest)
        return num_blocks

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache and bind it to the attention layers."""
        kv = self.kv_caches = allocate_kv_cache(self.model_config, num_blocks, self.block_size, self.kv_cache_dtype,
                                                self.device)
        for layer, (k_cache, v_cache) in zip(self.model.attention_layers(), kv):
            layer.bind_cache(k_cache, v_cache)

    def can_capture_cuda_graphs(self) -> bool:
        return self.device.type == "cuda" and self.attn_backend.supports_cuda_graphs

    def reserve_graph_memory(self, max_num_batched_tokens: int, num_speculative_tokens: int = 0) -> None:
        """Before the KV cache is sized: the memory the CUDA graphs will hold once captured (after the cache, which
        they read) is kept out of it. Their shared pool holds about the activations of the largest mixed graph,
        measured here by an eager forward of that many tokens, beside the graphs' logits and hidden-state buffers."""
        self.max_mixed_graph_tokens = max_num_batched_tokens
        mixed_tokens = token_ladder(max_num_batched_tokens)[-1]
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        allocated = torch.cuda.memory_allocated(self.device)
        self._profile_run(mixed_tokens)
        activations = torch.cuda.max_memory_allocated(self.device) - allocated
        decode_tokens = max(q * b[-1] for q, b in graph_ladders(self.max_num_seqs, num_speculative_tokens).items())
        self.graph_memory_bytes = (activations + decode_tokens * self.model_config.vocab_size * 4
                                   + mixed_tokens * self.model_config.hidden_size * self.dtype.itemsize)

    def capture_cuda_graphs(self, num_speculative_tokens: int = 0) -> None:
        """Capture decode steps, verify steps of k + 1 tokens with k draft tokens, and mixed steps up to the token
        budget given to `reserve_graph_memory` (none without it), as CUDA graphs."""
        self.graphs = None  # free the old graphs before capturing
        self.graphs = CUDAGraphs(self.model, self.max_num_seqs, cdiv(self.max_model_len, self.block_size),
                                 self.block_size, self.device, self.attn_backend.build_metadata, num_speculative_tokens,
                                 self.max_mixed_graph_tokens)

    @torch.inference_mode()
    def _profile_run(self, num_tokens: int) -> None:
        max_len = self.max_model_len
        lens = [min(max_len, num_tokens - i) for i in range(0, num_tokens, max_len)]
        cu_seqlens = torch.tensor([0] + lens, device=self.device).cumsum(0).to(torch.int32)
        positions = torch.cat([torch.arange(n, device=self.device) for n in lens])
        hidden = self.model(torch.zeros_like(positions), positions, NoCacheMetadata(cu_seqlens, max(lens)))
        self.model.compute_logits(hidden[cu_seqlens[1:].long() - 1])

    # ---- a step ----
    def prepare(self, scheduler_output: SchedulerOutput) -> InputBatch:
        """The step's inputs on the device."""
        return self._unpack(*self.pack(scheduler_output))

    def pack(self, scheduler_output: SchedulerOutput) -> tuple[torch.Tensor, BatchLayout]:
        """The step's inputs, built on the host, as one int64 tensor on the device."""
        self.block_table.release(scheduler_output.released_request_ids)
        self.block_table.truncate(scheduler_output.truncated_block_tables)
        entries = scheduler_output.entries
        rows, starts, lens, token_ids, from_gpu_dst, from_gpu_src, sample_positions = [], [], [], [], [], [], []
        prompt_positions = []
        for e in entries:
            if e.prompt_logprob_span:
                prompt_positions.extend(p - e.start + len(token_ids) for p in e.prompt_logprob_span)
            rows.append(self.block_table.row_of(e.seq))
            starts.append(e.start)
            lens.append(e.num_tokens)
            tokens = e.seq.token_ids[e.start:e.start + e.num_tokens]
            if e.draft_token_ids:
                tokens = tokens + e.draft_token_ids
            if len(tokens) < e.num_tokens:  # its input token is still being sampled on the device
                assert e.num_tokens == 1 and e.start == len(e.seq.token_ids)
                from_gpu_dst.append(len(token_ids))
                from_gpu_src.append(self._last_sampled_rows[e.seq.request_id])
                tokens = [0]
            token_ids += tokens
            if e.samples:  # the last token, and for a verify each draft token
                end = len(token_ids)
                sample_positions.extend(range(end - 1 - len(e.draft_token_ids), end))
        context_lens = [s + n for s, n in zip(starts, lens)]
        num_decodes = scheduler_output.num_decodes
        max_context_len = max(context_lens)

        B, T, bs = len(entries), len(token_ids), self.block_size
        starts_t, lens_t = torch.tensor(starts), torch.tensor(lens)
        cu_seqlens = torch.zeros(B + 1, dtype=torch.int64)
        torch.cumsum(lens_t, 0, out=cu_seqlens[1:])
        owner = torch.repeat_interleave(torch.arange(B), lens_t)           # each token's sequence
        positions = starts_t[owner] + torch.arange(T) - cu_seqlens[owner]
        width = cdiv(max_context_len, bs)
        block_tables = self.block_table.table[torch.tensor(rows), :width]
        slots = block_tables[owner, positions // bs].long() * bs + positions % bs
        sample_index = torch.tensor(sample_positions + prompt_positions, dtype=torch.int64)

        # All of it in one host-to-device copy (asynchronous from pinned memory), then views.
        fields = dict(zip(BATCH_FIELDS, (
            torch.tensor(token_ids), positions, slots, cu_seqlens, torch.tensor(context_lens), sample_index,
            torch.tensor(from_gpu_dst, dtype=torch.int64), torch.tensor(from_gpu_src, dtype=torch.int64),
            block_tables.flatten())))
        host = torch.empty(sum(f.numel() for f in fields.values()), dtype=torch.int64, pin_memory=self.use_async_copies)
        torch.cat([f.to(torch.int64) for f in fields.values()], out=host)
        flat = host.to(self.device, non_blocking=True)
        # Computed on the host, since asking the device would sync.
        every_row_samples = sample_positions + prompt_positions == list(range(T))
        layout = BatchLayout({name: f.numel() for name, f in fields.items()}, B, width, max(lens), max_context_len,
                             num_decodes, max(context_lens[:num_decodes], default=0), every_row_samples)
        if from_gpu_dst:
            views = layout.split(flat)
            views["input_ids"][views["from_device_dst"]] = self._last_sampled[views["from_device_src"]]
        return flat, layout

    def _unpack(self, flat: torch.Tensor, layout: BatchLayout) -> InputBatch:
        v = layout.split(flat)
        meta = AttentionMetadata(
            cu_seqlens_q=v["cu_seqlens"].int(), context_lens=v["context_lens"].int(), slot_mapping=v["slot_mapping"],
            block_tables=v["block_tables"].view(layout.num_seqs, layout.table_width).int(),
            block_size=self.block_size, max_query_len=layout.max_query_len,
            max_context_len=layout.max_context_len, num_decodes=layout.num_decodes,
            max_decode_context_len=layout.max_decode_context_len)
        return InputBatch(v["input_ids"], v["positions"], meta, v["sample_index"])

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> torch.Tensor:
        """Logits [sampling rows + prompt-logprob rows, vocab], float32, on the device."""
        flat, layout = self.pack(scheduler_output)
        return self.execute_batch(layout, flat)

    @torch.inference_mode()
    def execute_batch(self, layout: BatchLayout, flat: torch.Tensor | None = None) -> torch.Tensor:
        """The forward of a packed batch; with tensor parallelism, rank 0 broadcasts `flat` (others pass None)."""
        if tp_size() > 1:
            if flat is None:
                flat = torch.empty(sum(layout.field_sizes.values()), dtype=torch.int64, device=self.device)
            dist.broadcast(flat, src=0)
        batch = self._unpack(flat, layout)
        meta = batch.metadata
        shape = choose_graph(self.graphs.ladders, meta.num_seqs, meta.max_query_len) if self.graphs else None
        if shape is not None:
            self.graph_replays["decode" if shape[0] == 1 else "verify"] += 1
            logits = self.graphs.run(shape, batch.input_ids, batch.positions, meta)
            return logits if layout.every_row_samples else logits[batch.sample_index]
        meta = self.attn_backend.build_metadata(meta)
        size = choose_size(self.graphs.mixed_ladder, meta.num_tokens) if self.graphs else None
        if size is not None:
            self.graph_replays["mixed"] += 1
            hidden = self.graphs.run_mixed(size, batch.input_ids, batch.positions, meta)
        else:
            hidden = self.model(batch.input_ids, batch.positions, meta)
        return self.model.compute_logits(hidden[batch.sample_index])

    def _in_flight_tokens(self, seqs, processed: list[int]) -> torch.Tensor | None:
        """[B] each processed row's token still being sampled (-1: none), for the penalties; None if none."""
        src = [-1] * len(seqs)
        for i in processed:
            if seqs[i].num_output_placeholders > 1:  # this step's placeholder and the previous one
                src[i] = self._last_sampled_rows.get(seqs[i].request_id, -1)
        if max(src, default=-1) < 0:
            return None
        src = torch.tensor(src, device=self.device)
        return torch.where(src >= 0, self._last_sampled[src.clamp(min=0)], -1)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, scheduler_output: SchedulerOutput, draft_probs: torch.Tensor | None = None,
               grammar_bitmask: GrammarBitmask | None = None) -> SampledTokens | VerifiedTokens:
        """The next token of every sampling sequence. Verify steps use the rejection sampler
        (`draft_probs` [sampling sequences, k, vocab], None for n-gram draft tokens)."""
        seqs = scheduler_output.sampled_seqs
        drafts = scheduler_output.sampled_drafts
        num_rows = sum(len(d) + 1 for d in drafts)
        logits, prompt_logits = logits[:num_rows], logits[num_rows:]
        processed = [i for i, s in enumerate(seqs) if s.params.processes_logits]
        if any(drafts):
            self._last_sampled_rows = {}
            # The scheduler gives no draft tokens to rows with logits processing, a grammar or logprobs.
            first_rows = list(itertools.accumulate((len(d) + 1 for d in drafts[:-1]), initial=0))
            raw = logits
            if grammar_bitmask is not None:
                logits = grammar_bitmask.apply(logits, first_rows)
            if processed:
                logits = logits.clone()
                logits[first_rows] = process_logits(logits[first_rows], seqs, processed, self.sampler.eos_token_ids)
            tokens = self.rejection_sampler(logits, seqs, drafts, draft_probs)
            first = torch.tensor([t[0] for t in tokens], device=self.device)
            return VerifiedTokens(tokens, self._logprobs(raw[first_rows], first, prompt_logits, scheduler_output))
        raw = logits
        if grammar_bitmask is not None:
            logits = grammar_bitmask.apply(logits)
        tokens = (self.sampler(logits, seqs, processed, self._in_flight_tokens(seqs, processed)) if seqs
                  else self._last_sampled[:0])
        self._last_sampled = tokens
        self._last_sampled_rows = {seq.request_id: i for i, seq in enumerate(seqs)}
        return SampledTokens(tokens, self.copy_stream, self._logprobs(raw, tokens, prompt_logits, scheduler_output))

    def _logprobs(self, logits: torch.Tensor, tokens: torch.Tensor, prompt_logits: torch.Tensor,
                  scheduler_output: SchedulerOutput) -> StepLogprobs | None:
        """The requested logprobs (None if none): logits [sampling sequences, V] with their sampled tokens,
        and prompt_logits, one row per prompt-logprob position."""
        sampled = [(i, s.params.logprobs) for i, s in enumerate(scheduler_output.sampled_seqs)
                   if s.params.logprobs is not None]
        prompt = [(e.seq, e.prompt_logprob_span.start, e.seq.params.prompt_logprobs, len(e.prompt_logprob_span))
                  for e in scheduler_output.entries if e.prompt_logprob_span]
        if not sampled and not prompt:
            return None
        rows = [i for i, _ in sampled]
        targets = [t for seq, first, _, count in prompt for t in seq.prompt_token_ids[first + 1:first + 1 + count]]
        targets = torch.tensor(targets, dtype=torch.int64, pin_memory=self.use_async_copies)
        k = max([n for _, n in sampled] + [n for _, _, n, _ in prompt])
        tensors = compute_logprobs(torch.cat([logits[rows], prompt_logits]),
                                   torch.cat([tokens[rows], targets.to(self.device, non_blocking=True)]), k)
        return StepLogprobs(sampled, prompt, list(tensors))
