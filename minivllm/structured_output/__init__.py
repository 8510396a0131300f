"""Structured outputs: outputs that follow a JSON schema, a regex, a list of choices or a grammar.

Before sampling, the logits of tokens the request's grammar forbids become -inf (xgrammar, as in vLLM).
`manager.py` compiles the grammars and fills each step's bitmask; `bitmask.py` applies it to the logits.
"""
from .bitmask import GrammarBitmask, allowed_tokens
from .manager import RequestGrammar, StructuredOutputManager, check_structured_outputs

__all__ = ["GrammarBitmask", "RequestGrammar", "StructuredOutputManager", "allowed_tokens",
           "check_structured_outputs"]
