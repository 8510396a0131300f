"""Grammars for structured outputs with xgrammar, as in vLLM's `StructuredOutputManager`.

`check_structured_outputs` parses a spec when a request is added, so a bad one fails there, not mid-step.
`grammar_for` compiles it (cached per spec) into a matcher per request; `grammar_bitmask` fills each step's
allowed tokens. xgrammar and the tokenizer are loaded on first use.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable

import torch

from ..structured_outputs_params import StructuredOutputsParams
from .bitmask import GrammarBitmask

PARALLEL_FILL_MIN_ROWS = 128  # fill the bitmask on several threads from this many rows (as vLLM)
MAX_CACHED_GRAMMARS = 256
_XGRAMMAR_NOISE = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")  # "[16:06:29] file.cc:94: "


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise ValueError("structured outputs need xgrammar: pip install 'minivllm[structured]'") from None
    return xgrammar


def _problem(e: Exception) -> str:
    """xgrammar's message without the C++ file and line it comes from."""
    return _XGRAMMAR_NOISE.sub("", str(e).strip())


def _ebnf_literal(text: str) -> str:
    """`text` as an EBNF string literal. Not ASCII-escaped: xgrammar reads a UTF-16 escape pair (a non-BMP
    character) as two characters. A lone surrogate stays escaped."""
    return json.dumps(text, ensure_ascii=False).encode("utf-8", "backslashreplace").decode("utf-8")


def _choice_grammar(choices: list[str]) -> str:
    return "root ::= " + " | ".join(_ebnf_literal(c) for c in choices)


_ANY_OBJECT = '{"type": "object"}'  # OpenAI's json_object: an object, not any JSON value
_WHAT = {"json": "JSON schema", "regex": "regex", "grammar": "grammar", "choice": "choice", "json_object": "JSON"}


def check_structured_outputs(params: StructuredOutputsParams) -> None:
    """ValueError naming the problem if the spec's schema, regex or grammar does not parse."""
    xgr = _xgrammar()
    kind, text = params.key
    try:
        if kind == "json":
            xgr.Grammar.from_json_schema(text, any_whitespace=False)
        elif kind == "regex":
            xgr.Grammar.from_regex(text)
        elif kind == "grammar":
            xgr.Grammar.from_ebnf(text)
    except RuntimeError as e:
        raise ValueError(f"invalid {_WHAT[kind]} in structured_outputs: {_problem(e)}") from None


class RequestGrammar:
    """One request's place in its grammar (an xgrammar GrammarMatcher)."""

    def __init__(self, matcher):
        self.matcher = matcher

    def fork(self) -> RequestGrammar:
        """A copy at the same place, for another sequence of the request (n > 1)."""
        return RequestGrammar(self.matcher.fork())

    def accept_token(self, token: int) -> bool:
        """Advance by the sampled token; False if the grammar forbids it."""
        return self.matcher.accept_token(token)

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token accepted."""
        return self.matcher.is_terminated()


class StructuredOutputManager:
    """The grammar compiler, its cache, and each step's bitmask."""

    def __init__(self, vocab_size: int, eos_token_ids, load_tokenizer: Callable[[], object],
                 pin_memory: bool = False):
        self.vocab_size = vocab_size  # the logits' width: may exceed the tokenizer's
        self.eos_token_ids = list(eos_token_ids)
        self._load_tokenizer = load_tokenizer
        self.pin_memory = pin_memory
        self._compiler = None
        self._serial_matcher = self._parallel_matcher = None
        self.compiled: dict[tuple[str, str], object] = {}  # by StructuredOutputsParams.key, LRU first
        self.num_compilations = 0

    def _compiler_or_build(self):
        if self._compiler is None:
            xgr = _xgrammar()
            tokenizer = self._load_tokenizer()
            if tokenizer is None:
                raise ValueError("structured outputs need the model's tokenizer; this model folder has none")
            try:  # without EOS ids, xgrammar uses the tokenizer's
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=self.eos_token_ids or None)
            except (ValueError, RuntimeError) as e:
                raise ValueError(f"structured outputs: xgrammar cannot use this model's tokenizer: {e}") from None
            self._compiler = xgr.GrammarCompiler(info, max_threads=torch.get_num_threads())
            self._serial_matcher = xgr.BatchGrammarMatcher(max_threads=1)
            self._parallel_matcher = xgr.BatchGrammarMatcher()
        return self._compiler

    def compile(self, params: StructuredOutputsParams):
        """The compiled grammar of a spec, from the cache if it was compiled before."""
        key = params.key
        compiled = self.compiled.pop(key, None)
        if compiled is None:
            compiler = self._compiler_or_build()
            kind, text = key
            try:
                if kind == "json":
                    compiled = compiler.compile_json_schema(text, any_whitespace=False)
                elif kind == "json_object":
                    compiled = compiler.compile_json_schema(_ANY_OBJECT, any_whitespace=False)
                elif kind == "regex":
                    compiled = compiler.compile_regex(text)
                else:
                    compiled = compiler.compile_grammar(_choice_grammar(json.loads(text)) if kind == "choice"
                                                        else text)
            except RuntimeError as e:
                raise ValueError(f"invalid {_WHAT[kind]} in structured_outputs: {_problem(e)}") from None
            self.num_compilations += 1
            if len(self.compiled) >= MAX_CACHED_GRAMMARS:
                self.compiled.pop(next(iter(self.compiled)))
        self.compiled[key] = compiled  # (re)inserted as the most recently used
        return compiled

    def grammar_for(self, params: StructuredOutputsParams) -> RequestGrammar:
        xgr = _xgrammar()
        # (JSON is compiled without any_whitespace: a small model cannot loop on newlines.)
        return RequestGrammar(xgr.GrammarMatcher(self.compile(params), override_stop_tokens=self.eos_token_ids or None,
                                                 terminate_without_stop_token=not self.eos_token_ids))

    def grammar_bitmask(self, seqs) -> GrammarBitmask | None:
        """The allowed tokens of each unfinished sequence with a grammar (None if there is none)."""
        rows = [i for i, seq in enumerate(seqs) if seq.grammar is not None and not seq.is_finished]
        if not rows:
            return None
        words = (self.vocab_size + 31) // 32
        bitmask = torch.empty((len(rows), words), dtype=torch.int32, pin_memory=self.pin_memory)
        matchers = [seqs[i].grammar.matcher for i in rows]
        # For a few rows, waking threads costs more than it saves.
        matcher = self._parallel_matcher if len(rows) >= PARALLEL_FILL_MIN_ROWS else self._serial_matcher
        matcher.batch_fill_next_token_bitmask(matchers, bitmask)
        return GrammarBitmask(rows, bitmask)
