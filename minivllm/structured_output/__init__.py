"""Structured outputs: answers that follow a JSON schema, a regex, a list of choices or a grammar.

At every step the request's grammar says which tokens may come next; the others' logits become -inf before
sampling, so the answer parses by construction (xgrammar, as in vLLM).

- `manager.py`: the specs checked at the door, compiled once and cached, a matcher per request, and the
  bitmask of each step filled on the CPU (while the GPU runs the step's forward: see `LLMEngine`);
- `bitmask.py`: the bitmask applied to the logits on the device.
"""
from .bitmask import GrammarBitmask, allowed_tokens
from .manager import RequestGrammar, StructuredOutputManager, check_structured_outputs

__all__ = ["GrammarBitmask", "RequestGrammar", "StructuredOutputManager", "allowed_tokens",
           "check_structured_outputs"]
