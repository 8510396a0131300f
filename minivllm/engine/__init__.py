"""The engine: sequences, the scheduler, the model runner, the sampler and LLMEngine that joins them."""
from .llm_engine import LLMEngine

__all__ = ["LLMEngine"]
