"""minivllm: a compact, readable re-build of vLLM.

    >>> from minivllm import LLM, SamplingParams
    >>> llm = LLM("smollm2-135m")
    >>> llm.generate("The capital of France is", SamplingParams(temperature=0))[0].outputs[0].text
"""
from .engine.async_llm import AsyncLLM
from .llm import LLM
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "AsyncLLM", "SamplingParams", "RequestOutput", "CompletionOutput", "StructuredOutputsParams",
           "RequestOutputKind"]
__version__ = "0.1.0"
