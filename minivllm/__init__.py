"""minivllm: a compact, readable LLM inference engine that re-builds what makes vLLM fast.

    >>> from minivllm import LLM, SamplingParams
    >>> llm = LLM("smollm2-135m")
    >>> llm.generate("The capital of France is", SamplingParams(temperature=0))[0].outputs[0].text
"""
from .llm import LLM
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"
