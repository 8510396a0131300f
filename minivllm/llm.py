"""LLM: the offline entry point, vLLM's `LLM` class in small.

    >>> from minivllm import LLM, SamplingParams
    >>> llm = LLM("smollm2-135m")
    >>> out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8))
    >>> out[0].outputs[0].text
    ' Paris. ...'
    >>> llm.chat([{"role": "user", "content": "Hi!"}])[0].outputs[0].text
"""
from __future__ import annotations

import dataclasses

from .chat import encode_chat
from .config import engine_config
from .engine.core import startup_objects_frozen
from .engine.llm_engine import LLMEngine
from .outputs import RequestOutput
from .sampling_params import RequestOutputKind, SamplingParams
from .utils import plural, progress


class LLM:
    def __init__(self, model: str, **engine_args):
        self.llm_engine = LLMEngine.from_config(engine_config("LLM", model, engine_args))
        self._next_id = 0

    @property
    def tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; one RequestOutput per prompt, in input order."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                 and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError("prompts must be a string, a list of token ids or a list of prompts, "
                             f"got {type(prompts).__name__}")
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            params = plural(len(sampling_params), "SamplingParams", "SamplingParams")
            raise ValueError(f"{plural(len(prompts), 'prompt')} but {params}")
        engine = self.llm_engine
        final_only = {}  # only each request's last output is wanted: no output is built before it (as vLLM)
        ids = []
        try:
            for prompt, params in zip(prompts, sampling_params):
                if isinstance(params, SamplingParams):
                    if id(params) not in final_only:
                        final_only[id(params)] = dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
                    params = final_only[id(params)]
                ids.append(str(self._next_id))
                self._next_id += 1
                engine.add_request(ids[-1], prompt, params)
        except ValueError as e:  # a bad prompt: take back this call's requests, keep the engine clean
            for request_id in ids:
                engine.abort_request(request_id)
            raise ValueError(f"prompt {len(ids) - 1}: {e}") from None
        finished: dict[str, RequestOutput] = {}
        # Frozen: a full garbage collection would walk torch's and transformers' objects, a pause of several
        # milliseconds in the steps of a large batch.
        with progress(total=len(ids), desc="generate", enabled=use_tqdm) as bar, startup_objects_frozen():
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        bar.update(1)
        return [finished[i] for i in ids]

    def shutdown(self) -> None:
        """Stop the engine's worker processes (with tensor_parallel_size > 1); also done at exit."""
        self.llm_engine.shutdown()

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} dicts) or a list of them, through the
        tokenizer's chat template, with the assistant's turn opened."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [encode_chat(self.tokenizer, c) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)
