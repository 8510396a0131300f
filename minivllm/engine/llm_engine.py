"""LLMEngine: vLLM's offline engine API, built from an input processor, the engine core and the output processor.

    >>> engine = LLMEngine.from_config(EngineConfig("smollm2-135m"))
    >>> engine.add_request("a", [1, 2, 3], SamplingParams(temperature=0, max_tokens=4))
    >>> while engine.has_unfinished_requests():
    ...     for out in engine.step():
    ...         print(out.request_id, out.outputs[0].token_ids, out.finished)

`add_request` checks and tokenizes (`InputProcessor`) and hands the core its requests; `step` runs one
`EngineCore.step` in this process and turns its new token ids into outputs (`OutputProcessor`), aborting in
the core what a stop string ended. `AsyncLLM` is the same with the core in a process of its own.
"""
from __future__ import annotations

from ..config import EngineConfig
from ..models.loader import load_tokenizer, resolve_model
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from .core import EngineCore
from .input_processor import InputProcessor
from .output_processor import OutputProcessor, RequestState


class LLMEngine:
    def __init__(self, engine_core: EngineCore, input_processor: InputProcessor):
        self.engine_core = engine_core
        self.input_processor = input_processor
        self.output_processor = OutputProcessor(input_processor.tokenizer)

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        tokenizer = load_tokenizer(resolve_model(config.model).folder)
        core = EngineCore.from_config(config)
        p = core.input_processor
        return cls(core, InputProcessor(tokenizer, p.vocab_size, p.max_model_len, p.block_size, p.num_total_blocks,
                                        p.max_num_batched_tokens, p.sliding_window))

    # ---- what the parts know (for notebooks and benchmarks) ----------------------------
    @property
    def config(self) -> EngineConfig:
        return self.engine_core.config

    @property
    def scheduler(self):
        return self.engine_core.scheduler

    @property
    def executor(self):
        return self.engine_core.executor

    @property
    def proposer(self):
        return self.engine_core.executor.proposer

    @property
    def structured_output(self):
        return self.engine_core.structured_output

    @property
    def runner(self):
        """Rank 0's model runner, the one in this process."""
        return self.engine_core.executor.runner

    @property
    def model(self):
        return self.runner.model

    @property
    def model_config(self):
        return self.runner.model_config

    @property
    def device(self):
        return self.runner.device

    @property
    def dtype(self):
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
    def block_manager(self):
        return self.scheduler.blocks

    @property
    def requests(self) -> dict:
        """The core's live requests by id (`Sequence`s; n > 1: one per completion)."""
        return self.engine_core.requests

    # ---- requests ----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt, sampling_params: SamplingParams | None = None) -> None:
        if request_id in self.output_processor.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, token_ids, params = self.input_processor.process(prompt, sampling_params)
        if params.n > self.scheduler.max_num_seqs:
            raise ValueError(f"n={params.n} completions do not fit in max_num_seqs={self.scheduler.max_num_seqs}")
        state = RequestState(request_id, request_id, text, token_ids, params, self.tokenizer)
        core_requests = state.core_requests()
        if params.structured_outputs is not None:  # compile first: a grammar error must leave nothing queued
            self.engine_core.structured_output.grammar_for(params.structured_outputs)
        for request in core_requests:
            self.engine_core.add_request(request)
        self.output_processor.add_request(state)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """End a request wherever it is; its blocks come back. Returns its last output (finish_reason
        "abort"), or None for an unknown or finished id."""
        state = self.output_processor.requests.get(request_id)
        if state is None:
            return None
        self.engine_core.abort_requests(self.output_processor.core_ids(state))
        return self.output_processor.finish(state, "abort")

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """One engine-core step; the outputs of the requests that advanced (`finished` set on the last)."""
        outputs, to_abort = self.output_processor.process_outputs(self.engine_core.step())
        if to_abort:  # stop strings: the core stops generating what nobody will read
            self.engine_core.abort_requests(to_abort)
        return outputs

    def get_stats(self) -> dict:
        return self.engine_core.get_stats()

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do with one rank). The engine is unusable after."""
        self.engine_core.shutdown()
