"""The engine: the engine core (scheduler + executor), the input and output processors, LLMEngine and AsyncLLM."""
from .llm_engine import LLMEngine

__all__ = ["LLMEngine"]
